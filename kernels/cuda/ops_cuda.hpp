// CUDA twins of the per-row and elementwise kernels of kernels.hpp, and the bf16 GEMMs (cuBLAS),
// for the mixed-precision model on the GPU (src/model/model_cuda.cpp):
//   fp32: master weights, gradients, AdamW moments, the residual stream and its gradient, logits;
//   bf16: the weight copy the GEMMs read, GEMM inputs (normed activations, q/k/v, attention out,
//         MLP activations, dlogits), attention in/out.
// Every GEMM accumulates in fp32. All pointers are device pointers; every call is asynchronous on
// `stream` unless it says otherwise; every launch and library call is checked (file and line).
// Layouts and semantics as kernels.hpp (rows of C = d_model, heads (N, nh, D), RoPE rotate-half).
// Plain C++ header (no CUDA syntax), so C++ files can call it.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.hpp"  // RopeFreqs

namespace sb::kernels::cuda {

using bf16 = __nv_bfloat16;

// ---- GEMMs (cuBLAS, bf16 inputs, fp32 accumulation) ----
// A cuBLAS handle bound to one stream; owns its workspace. Not copyable.
class Blas {
 public:
  explicit Blas(cudaStream_t stream = nullptr);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t handle() const { return h_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cublasHandle_t h_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// Row-major, as kernels::gemm: C (M,N) = alpha * op(A) @ op(B) + beta * C, op(A) (M,K), op(B) (K,N).
void gemm(Blas& b, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc);
void gemm(Blas& b, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, bf16* C, int ldc);
// y (N,out) = x (N,in) @ W^T, W (out,in). y overwritten.
void linear_fwd(Blas& b, const bf16* x, const bf16* W, float* y, int N, int in, int out);
void linear_fwd(Blas& b, const bf16* x, const bf16* W, bf16* y, int N, int in, int out);
// dW (out,in) += dy^T @ x (fp32); dx (N,in) = dy @ W, added to dx when accumulate_dx (skipped when
// dx == nullptr).
void linear_bwd(Blas& b, const bf16* x, const bf16* W, const bf16* dy, float* dx, bool accumulate_dx, float* dW,
                int N, int in, int out);
void linear_bwd(Blas& b, const bf16* x, const bf16* W, const bf16* dy, bf16* dx, bool accumulate_dx, float* dW,
                int N, int in, int out);
// Bias of a linear layer (bias.cu): y (N,out) bf16 += b (out) fp32 on every row; backward
// db (out) fp32 += column sums of dy (N,out) bf16, its rows ld apart (0: out; a column block of a
// packed array).
void bias_add_fwd(bf16* y, const float* b, int N, int out, cudaStream_t stream = nullptr);
void bias_add_bwd(const bf16* dy, float* db, int N, int out, cudaStream_t stream = nullptr, int ld = 0);

// ---- per-row / elementwise ----
// y (N,C) bf16 = x / rms(x) * w; rstd (N). x fp32 (the residual stream), w fp32.
void rmsnorm_fwd(const float* x, const float* w, bf16* y, float* rstd, int N, int C, float eps,
                 cudaStream_t stream = nullptr);
// dx (N,C) += ..., dw (C) += ... (fp32). dy fp32.
void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int N,
                 int C, cudaStream_t stream = nullptr);
// In place on x (N, nh, D) bf16; angles pos[t] * rope.inv_freq[d] (a device table of D/2 doubles,
// kernels.hpp RopeFreqs) reduced in double precision first, so long positions keep their accuracy,
// then sin/cos in fp32 times rope.scale.
void rope_fwd(bf16* x, const int32_t* pos, int N, int nh, int D, RopeFreqs rope, cudaStream_t stream = nullptr);
void rope_bwd(bf16* dx, const int32_t* pos, int N, int nh, int D, RopeFreqs rope, cudaStream_t stream = nullptr);
// h = silu(gate) * up; backward writes dgate, dup (overwritten). bf16, math in fp32.
void swiglu_fwd(const bf16* gate, const bf16* up, bf16* h, size_t n, cudaStream_t stream = nullptr);
void swiglu_bwd(const bf16* gate, const bf16* up, const bf16* dh, bf16* dgate, bf16* dup, size_t n,
                cudaStream_t stream = nullptr);
// Qwen3's q_norm / k_norm (head_norm.cu): RMSNorm over each head's D values, weight w (D) fp32.
// x: N rows at row stride ld (elements) of nh heads of D, bf16, normed in place; xs (N*nh, D) gets
// the input (the backward's), rstd (N*nh). The backward takes dy (the gradient of the normed values,
// rows at stride ld) and overwrites it with the gradient of the input; dw (D) += its gradient
// (nullptr: not computed, a frozen weight).
void head_rmsnorm_fwd(bf16* x, int64_t ld, const float* w, bf16* xs, float* rstd, int N, int nh, int D, float eps,
                      cudaStream_t stream = nullptr);
void head_rmsnorm_bwd(bf16* dy, int64_t ld, const bf16* xs, const float* w, const float* rstd, float* dw, int N,
                      int nh, int D, cudaStream_t stream = nullptr);
// ---- fused (fused.cu; issue 18 item 4) ----
// The CUDA model runs these on the packed projections (q/k/v in one GEMM and gate/up in one, whose
// outputs they read and write as column blocks of one (N, width) array); the unfused chains above
// are their references (test_ops_cuda) and the model's before (src/model/README.md).
// Residual add + rmsnorm + bf16: xm (N,C) += x, then y = bf16(rmsnorm(xm) * w), rstd (N), in one
// pass (xm holds a GEMM's output on entry, the residual stream on exit).
void add_rmsnorm_fwd(float* xm, const float* x, const float* w, bf16* y, float* rstd, int N, int C, float eps,
                     cudaStream_t stream = nullptr);
// rmsnorm_bwd (dx += ..., dw += ...) and dx16 = bf16(dx) (skipped when nullptr) in one pass.
void rmsnorm_bwd_fused(const float* x, const float* w, const float* rstd, const float* dy, float* dx, bf16* dx16,
                       float* dw, int N, int C, cudaStream_t stream = nullptr);
// bias_add_fwd on q (N,H,D), k and v (N,Hkv,D) (biases nullptr: none), then rope_fwd on q and k: one
// launch. Backward: rope_bwd on dq and dk in one launch (the bias gradients stay bias_add_bwd).
void qkv_rope_fwd(bf16* q, bf16* k, bf16* v, const float* bq, const float* bk, const float* bv, const int32_t* pos,
                  int N, int H, int Hkv, int D, RopeFreqs rope, cudaStream_t stream = nullptr);
void qk_rope_bwd(bf16* dq, bf16* dk, const int32_t* pos, int N, int H, int Hkv, int D, RopeFreqs rope,
                 cudaStream_t stream = nullptr);
// The same from and to packed rows: qkv (N, H*D + 2*Hkv*D) bf16, one GEMM's q|k|v output, to the
// separate q (N,H,D), k, v (N,Hkv,D) the attention reads (bias, RoPE, v copied); backward dq, dk, dv
// to dqkv (N, H*D + 2*Hkv*D), the inverse rotation of dq and dk (the packed GEMMs' input).
void qkv_rope_unpack_fwd(const bf16* qkv, bf16* q, bf16* k, bf16* v, const float* bq, const float* bk,
                         const float* bv, const int32_t* pos, int N, int H, int Hkv, int D, RopeFreqs rope,
                         cudaStream_t stream = nullptr);
void qkv_rope_pack_bwd(const bf16* dq, const bf16* dk, const bf16* dv, bf16* dqkv, const int32_t* pos, int N, int H,
                       int Hkv, int D, RopeFreqs rope, cudaStream_t stream = nullptr);
// swiglu_fwd / swiglu_bwd with 16-byte loads and stores (8 bf16): the same bits; falls back to
// them when n is not a multiple of 8 or a pointer is not 16-byte aligned.
void swiglu_fwd_wide(const bf16* gate, const bf16* up, bf16* h, size_t n, cudaStream_t stream = nullptr);
void swiglu_bwd_wide(const bf16* gate, const bf16* up, const bf16* dh, bf16* dgate, bf16* dup, size_t n,
                     cudaStream_t stream = nullptr);
// The same on one packed gate|up GEMM output gu (N, 2F) (gate columns [0, F), up [F, 2F)): h (N, F);
// backward dgu (N, 2F) likewise packed, the input of one (2F, C) GEMM.
void swiglu_fwd_packed(const bf16* gu, bf16* h, int N, int F, cudaStream_t stream = nullptr);
void swiglu_bwd_packed(const bf16* gu, const bf16* dh, bf16* dgu, int N, int F, cudaStream_t stream = nullptr);
// out (N,C) fp32 = table[ids] (fp32 master table, or a bf16 one: LoRA's frozen base). Backward:
// dtable[ids] += dout.
void embedding_fwd(const int32_t* ids, const float* table, float* out, int N, int C, cudaStream_t stream = nullptr);
void embedding_fwd(const int32_t* ids, const bf16* table, float* out, int N, int C, cudaStream_t stream = nullptr);
void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int N, int C, cudaStream_t stream = nullptr);
// Fused cross-entropy over fp32 logits (N,V), targets (N) (-1 = none): loss (N) = lse - z[target]
// (0 on untargeted rows), dlogits (N,V) bf16 = scale * (softmax - onehot) on targeted rows, 0 elsewhere;
// argmax (N) the greedy prediction of every row (optional, nullptr). One block per row.
void cross_entropy(const float* logits, const int32_t* targets, float* loss, bf16* dlogits, int32_t* argmax, int N,
                   int V, float scale, cudaStream_t stream = nullptr);
// The same over bf16 logits (N,V) (cross_entropy.cu), dlogits written over them when grad (the
// LM head's default on the GPU: one bf16 buffer a chunk instead of fp32 logits + bf16 dlogits).
void cross_entropy_inplace(bf16* logits, const int32_t* targets, float* loss, bool grad, int32_t* argmax, int N, int V,
                           float scale, cudaStream_t stream = nullptr);
// AdamW as kernels::adamw (bias correction, decoupled decay, step counts from 1) on fp32 master p,
// moments m, v; also writes p16 = bf16(p) when p16 != nullptr.
void adamw(float* p, bf16* p16, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, int64_t step, cudaStream_t stream = nullptr);
void to_bf16(const float* x, bf16* y, size_t n, cudaStream_t stream = nullptr);
void add_inplace(float* x, const float* y, size_t n, cudaStream_t stream = nullptr);  // x += y
void scale_inplace(float* x, float c, size_t n, cudaStream_t stream = nullptr);     // x *= c
// out[i] = bf16(sum over m = 0..G-1, in that order, of float(in[m * n + i])): the sum of G blocks in
// fp32, rounded once (a split document's dK/dV reduce-scatter, src/parts/groups_cuda.cpp; the host
// twin sum_blocks_bf16 in src/comm/row_exchange.hpp gives the same bits).
void sum_blocks(const bf16* in, int G, size_t n, bf16* out, cudaStream_t stream = nullptr);
// sum of x^2 accumulated in double; synchronises `stream` and returns the value on the host.
double sum_squares(const float* x, size_t n, cudaStream_t stream = nullptr);

}  // namespace sb::kernels::cuda
