// Fused elementwise kernels of the layer on the GPU (issue 18 item 4): each one replaces a chain of
// ops.cu / bias.cu launches that made separate passes over the same (N, C) or (N, heads * D) arrays.
// Same formulas and the same roundings as the chains they replace (see ops_cuda.hpp), so the fused
// and unfused paths agree to fp32 summation order. SB_FUSE=0 selects the unfused chains.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace sb::kernels::cuda {

namespace {
int g_fuse_override = -1;  // set_fuse_override: -1 the environment, 0 off, 1 on
}

bool fuse_enabled() {
  if (g_fuse_override >= 0) return g_fuse_override == 1;
  static const bool on = [] {
    const char* e = std::getenv("SB_FUSE");
    if (!e || !*e || std::string_view(e) == "1") return true;
    if (std::string_view(e) == "0") return false;
    throw Error(std::string("SB_FUSE='") + e + "': expected 1 (fused elementwise kernels) or 0 (unfused)");
  }();
  return on;
}

void set_fuse_override(int on) { g_fuse_override = on < 0 ? -1 : on > 0 ? 1 : 0; }

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBwdCtas = 1056;  // rmsnorm backward: 8 CTAs per SM of an H200, rows strided over them
constexpr int kMaxSmemC = 6000;    // rmsnorm backward: C doubles of dw partials + block_sum's 256 B <= 48 KB

// ---- residual add + rmsnorm + bf16 ----
// xm (N,C) fp32 += x; y (N,C) bf16 = xm / rms(xm) * w; rstd (N). One CTA per row; sum of squares in
// double as rmsnorm_fwd. Replaces: copy x -> xm, the GEMM adding into xm, rmsnorm_fwd (xm read twice more).
__global__ void __launch_bounds__(kThreads) add_rmsnorm_fwd_kernel(float* xm, const float* x, const float* w,
                                                                    bf16* y, float* rstd, int C, float eps) {
  const int64_t t = blockIdx.x;
  float* mt = xm + t * C;        // (C)
  const float* xt = x + t * C;   // (C)
  double ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = mt[c] + xt[c];
    mt[c] = v;
    ss = __fma_rn(double(v), double(v), ss);  // as rmsnorm_fwd: the same rstd bits
  }
  ss = block_sum(ss);  // each thread reads back only the columns it wrote
  const float r = float(1.0 / sqrt(ss / C + double(eps)));
  if (threadIdx.x == 0) rstd[t] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[t * C + c] = __float2bfloat16(mt[c] * r * w[c]);
}

// ---- rmsnorm backward, one pass ----
// dx (N,C) += r*dy*w - x * (r^3/C * sum_c dy*w*x); dx16 = bf16(dx) (optional: the next GEMM's input);
// dw (C) += sum_t dy*x*r. Rows strided over the CTAs; each thread keeps the dw partials of its own
// columns in shared memory (double, as rmsnorm_bwd_dw), one fp32 atomicAdd per column and CTA at the
// end. Replaces rmsnorm_bwd's dx and dw kernels (x and dy read twice) and to_bf16 (dx read again).
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_fused_kernel(const float* x, const float* w,
                                                                      const float* rstd, const float* dy, float* dx,
                                                                      bf16* dx16, float* dw, int N, int C) {
  extern __shared__ double dwp[];  // (C)
  for (int c = threadIdx.x; c < C; c += blockDim.x) dwp[c] = 0;
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    const float* xt = x + t * C;    // (C)
    const float* dyt = dy + t * C;  // (C)
    const double rd = rstd[t];
    const float r = float(rd), k = rmsnorm_bwd_coef(xt, dyt, w, rd, C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xv = xt[c], g = dyt[c];
      const float v = dx[t * C + c] + (r * g * w[c] - xv * k);
      dx[t * C + c] = v;
      if (dx16) dx16[t * C + c] = __float2bfloat16(v);
      dwp[c] += double(g) * xv * rd;
    }
  }
  if (!dw) return;
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dw + c, float(dwp[c]));
}

// ---- bias + RoPE of q and k (+ the v bias), one launch ----
// q (N,H,D), k (N,Hkv,D), v (N,Hkv,D) bf16 in place; biases fp32 (nullptr: none). One thread per
// (token, pair d < D/2): the angle once for all H + Hkv heads. With biases each element is first
// rounded to bf16(x + b) as bias_add_fwd writes it, so this equals bias_add_fwd then rope_fwd.
__global__ void __launch_bounds__(kThreads) qkv_rope_kernel(bf16* q, bf16* k, bf16* v, const float* bq,
                                                             const float* bk, const float* bv, const int32_t* pos,
                                                             int N, int H, int Hkv, int D, double theta,
                                                             float sign) {
  const int half = D / 2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(N) * half;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / half;
    const int d = int(i - t * half);
    bf16* qt = q + t * H * D;    // (H, D)
    bf16* kt = k + t * Hkv * D;  // (Hkv, D)
    float sn, cs;
    rope_sincos(pos[t], d, D, theta, sign, sn, cs);
    rope_rotate(qt, H, D, d, sn, cs, bq);
    rope_rotate(kt, Hkv, D, d, sn, cs, bk);
    if (!bv) continue;
    bf16* vt = v + t * Hkv * D;  // (Hkv, D)
    for (int h = 0; h < Hkv; h++)
      for (const int j : {h * D + d, h * D + d + half}) vt[j] = __float2bfloat16(__bfloat162float(vt[j]) + bv[j]);
  }
}

// ---- SwiGLU, 16 bytes per load ----
// As ops.cu's swiglu kernels (same math, swiglu.cuh), 8 bf16 per thread and array: (n/8) uint4.
union Bf8 {
  uint4 u;
  bf16 h[8];
};
__global__ void __launch_bounds__(kThreads) swiglu_fwd_wide_kernel(const uint4* gate, const uint4* up, uint4* h,
                                                                    int64_t n8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    Bf8 g{gate[i]}, u{up[i]}, o;
    for (int j = 0; j < 8; j++) o.h[j] = __float2bfloat16(swiglu_h(__bfloat162float(g.h[j]), __bfloat162float(u.h[j])));
    h[i] = o.u;
  }
}
__global__ void __launch_bounds__(kThreads) swiglu_bwd_wide_kernel(const uint4* gate, const uint4* up,
                                                                    const uint4* dh, uint4* dgate, uint4* dup,
                                                                    int64_t n8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    Bf8 g{gate[i]}, u{up[i]}, d{dh[i]}, og, ou;
    for (int j = 0; j < 8; j++) {
      float a, b;
      swiglu_grads(__bfloat162float(g.h[j]), __bfloat162float(u.h[j]), __bfloat162float(d.h[j]), a, b);
      og.h[j] = __float2bfloat16(a);
      ou.h[j] = __float2bfloat16(b);
    }
    dgate[i] = og.u;
    dup[i] = ou.u;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 ? b : 65536);
}

}  // namespace

void add_rmsnorm_fwd(float* xm, const float* x, const float* w, bf16* y, float* rstd, int N, int C, float eps,
                     cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  add_rmsnorm_fwd_kernel<<<N, kThreads, 0, stream>>>(xm, x, w, y, rstd, C, eps);
  SB_CUDA_CHECK_LAUNCH("add_rmsnorm_fwd_kernel");
}

void rmsnorm_bwd_fused(const float* x, const float* w, const float* rstd, const float* dy, float* dx, bf16* dx16,
                       float* dw, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C > kMaxSmemC) {  // the dw partials would not fit in shared memory: the unfused chain
    rmsnorm_bwd(x, w, rstd, dy, dx, dw, N, C, stream);
    if (dx16) to_bf16(dx, dx16, size_t(N) * C, stream);
    return;
  }
  const int ctas = N < kMaxBwdCtas ? N : kMaxBwdCtas;
  rmsnorm_bwd_fused_kernel<<<ctas, kThreads, size_t(C) * sizeof(double), stream>>>(x, w, rstd, dy, dx, dx16, dw, N,
                                                                                   C);
  SB_CUDA_CHECK_LAUNCH("rmsnorm_bwd_fused_kernel");
}

void qkv_rope_fwd(bf16* q, bf16* k, bf16* v, const float* bq, const float* bk, const float* bv, const int32_t* pos,
                  int N, int H, int Hkv, int D, double theta, cudaStream_t stream) {
  const int64_t pairs = int64_t(N) * (D / 2);
  if (pairs <= 0) return;
  qkv_rope_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(q, k, v, bq, bk, bv, pos, N, H, Hkv, D, theta, 1.0f);
  SB_CUDA_CHECK_LAUNCH("qkv_rope_kernel");
}

void qk_rope_bwd(bf16* dq, bf16* dk, const int32_t* pos, int N, int H, int Hkv, int D, double theta,
                 cudaStream_t stream) {
  const int64_t pairs = int64_t(N) * (D / 2);
  if (pairs <= 0) return;
  qkv_rope_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(dq, dk, nullptr, nullptr, nullptr, nullptr, pos, N, H,
                                                            Hkv, D, theta, -1.0f);
  SB_CUDA_CHECK_LAUNCH("qkv_rope_kernel (backward)");
}

void swiglu_fwd_wide(const bf16* gate, const bf16* up, bf16* h, size_t n, cudaStream_t stream) {
  if (n % 8 || !aligned16(gate) || !aligned16(up) || !aligned16(h)) return swiglu_fwd(gate, up, h, n, stream);
  if (n == 0) return;
  const int64_t n8 = int64_t(n / 8);
  swiglu_fwd_wide_kernel<<<grid_for(n8), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(gate),
                                                                reinterpret_cast<const uint4*>(up),
                                                                reinterpret_cast<uint4*>(h), n8);
  SB_CUDA_CHECK_LAUNCH("swiglu_fwd_wide_kernel");
}

void swiglu_bwd_wide(const bf16* gate, const bf16* up, const bf16* dh, bf16* dgate, bf16* dup, size_t n,
                     cudaStream_t stream) {
  if (n % 8 || !aligned16(gate) || !aligned16(up) || !aligned16(dh) || !aligned16(dgate) || !aligned16(dup))
    return swiglu_bwd(gate, up, dh, dgate, dup, n, stream);
  if (n == 0) return;
  const int64_t n8 = int64_t(n / 8);
  swiglu_bwd_wide_kernel<<<grid_for(n8), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(gate), reinterpret_cast<const uint4*>(up), reinterpret_cast<const uint4*>(dh),
      reinterpret_cast<uint4*>(dgate), reinterpret_cast<uint4*>(dup), n8);
  SB_CUDA_CHECK_LAUNCH("swiglu_bwd_wide_kernel");
}

}  // namespace sb::kernels::cuda
