// CUDA twins of the per-row and elementwise kernels of kernels/cpu/elementwise.cpp (same formulas),
// for the mixed-precision model: fp32 residual stream / master weights / moments, bf16 GEMM inputs.
//   per row (one CTA per row): rmsnorm fwd and dx (cross-entropy: cross_entropy.cu);
//   column tiles over row chunks: rmsnorm dw (one fp32 atomicAdd per column and chunk);
//   elementwise (grid-stride, 64-bit indices: n can exceed 2^31): the rest.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace sb::kernels::cuda {
namespace {

constexpr int kThreads = 256;          // elementwise and per-row CTAs
constexpr int64_t kMaxBlocks = 65536;  // grid-stride cap for elementwise kernels (plenty for 132 SMs)

// Blocks for a grid-stride loop over n items.
unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < kMaxBlocks ? b : kMaxBlocks);
}

// Grid-stride loop over [0, n) with 64-bit indices.
#define SB_GRID_LOOP(i, n)                                                                          \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(n);                  \
       i += int64_t(gridDim.x) * blockDim.x)

// ---- rmsnorm ----
// x (N,C) fp32, w (C), y (N,C) bf16, rstd (N). One CTA per row; sum of squares in double as the CPU.
__global__ void __launch_bounds__(kThreads) rmsnorm_fwd_kernel(const float* x, const float* w, bf16* y,
                                                                float* rstd, int C, float eps) {
  const int64_t t = blockIdx.x;
  const float* xt = x + t * C;  // (C)
  double ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    ss = __fma_rn(double(xt[c]), double(xt[c]), ss);  // as fused.cu's add_rmsnorm_fwd
  ss = block_sum(ss);
  const float r = float(1.0 / sqrt(ss / C + double(eps)));
  if (threadIdx.x == 0) rstd[t] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[t * C + c] = __float2bfloat16(xt[c] * r * w[c]);
}

// dx (N,C) += r*dy*w - x * (r^3/C * sum_c dy*w*x). One CTA per row.
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_dx_kernel(const float* x, const float* w,
                                                                   const float* rstd, const float* dy, float* dx,
                                                                   int C) {
  const int64_t t = blockIdx.x;
  const float* xt = x + t * C;    // (C)
  const float* dyt = dy + t * C;  // (C)
  const double rd = rstd[t];
  const float r = float(rd), k = rmsnorm_bwd_coef(xt, dyt, w, rd, C);
  for (int c = threadIdx.x; c < C; c += blockDim.x) dx[t * C + c] += r * dyt[c] * w[c] - xt[c] * k;
}

// dw (C) += sum_t dy*x*r. CTA = 32 columns x kDwRows threads, walking `chunk` rows; the partial sums
// (double) are reduced over the CTA's rows in shared memory, then one fp32 atomicAdd per column and
// CTA (N/chunk atomics per column instead of N).
constexpr int kDwRows = 8;
__global__ void __launch_bounds__(32 * kDwRows) rmsnorm_bwd_dw_kernel(const float* x, const float* rstd,
                                                                       const float* dy, float* dw, int N, int C,
                                                                       int chunk) {
  __shared__ double part[kDwRows][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.y) * chunk;
  const int64_t t1 = t0 + chunk < N ? t0 + chunk : N;
  double acc = 0;
  if (c < C)
    for (int64_t t = t0 + threadIdx.y; t < t1; t += kDwRows) acc += double(dy[t * C + c]) * x[t * C + c] * rstd[t];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int r = 1; r < kDwRows; r++) acc += part[r][threadIdx.x];
    atomicAdd(dw + c, float(acc));
  }
}

// ---- rope (rotate-half) ----
// x (N,nh,D) bf16 in place; one thread per (token, pair d < D/2), looping over the heads so the
// angle is computed once (rope.cuh). sign -1: inverse rotation.
__global__ void __launch_bounds__(kThreads) rope_kernel(bf16* x, const int32_t* pos, int N, int nh, int D,
                                                         RopeFreqs rope, float sign) {
  const int half = D / 2;
  SB_GRID_LOOP(i, int64_t(N) * half) {
    const int64_t t = i / half;
    const int d = int(i - t * half);
    float sn, cs;
    rope_sincos(pos[t], d, rope, sign, sn, cs);
    rope_rotate(x + t * nh * D, x + t * nh * D, nh, D, d, sn, cs);
  }
}

// ---- swiglu ----
// gate, up, h (n) bf16; math in fp32 (swiglu.cuh). dgate, dup overwritten.
__global__ void __launch_bounds__(kThreads) swiglu_fwd_kernel(const bf16* gate, const bf16* up, bf16* h,
                                                               size_t n) {
  SB_GRID_LOOP(i, n) h[i] = __float2bfloat16(swiglu_h(__bfloat162float(gate[i]), __bfloat162float(up[i])));
}
__global__ void __launch_bounds__(kThreads) swiglu_bwd_kernel(const bf16* gate, const bf16* up, const bf16* dh,
                                                               bf16* dgate, bf16* dup, size_t n) {
  SB_GRID_LOOP(i, n) {
    float dg, du;
    swiglu_grads(__bfloat162float(gate[i]), __bfloat162float(up[i]), __bfloat162float(dh[i]), dg, du);
    dgate[i] = __float2bfloat16(dg);
    dup[i] = __float2bfloat16(du);
  }
}

// ---- embedding ----
// ids (N), table (V,C), out (N,C); one thread per output element.
template <class W>
__global__ void __launch_bounds__(kThreads) embedding_fwd_kernel(const int32_t* ids, const W* table, float* out,
                                                                  int N, int C) {
  SB_GRID_LOOP(i, int64_t(N) * C) {
    const int64_t t = i / C, c = i - t * C;
    out[i] = float(table[int64_t(ids[t]) * C + c]);
  }
}
// dtable[ids[t]] += dout[t]: repeated ids hit the same row, hence atomicAdd.
__global__ void __launch_bounds__(kThreads) embedding_bwd_kernel(const int32_t* ids, const float* dout,
                                                                  float* dtable, int N, int C) {
  SB_GRID_LOOP(i, int64_t(N) * C) {
    const int64_t t = i / C, c = i - t * C;
    atomicAdd(dtable + int64_t(ids[t]) * C + c, dout[i]);
  }
}

// ---- AdamW ----
// p, g, m, v (n) fp32, p16 (n) bf16 optional; bc1, bc2 = 1 - beta^step from the host as kernels::adamw.
__global__ void __launch_bounds__(kThreads) adamw_kernel(float* p, bf16* p16, const float* g, float* m, float* v,
                                                          size_t n, float lr, float beta1, float beta2, float eps,
                                                          float weight_decay, float bc1, float bc2) {
  SB_GRID_LOOP(i, n) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    float pi = p[i];
    pi -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * pi);
    p[i] = pi;
    if (p16) p16[i] = __float2bfloat16(pi);
  }
}

// ---- small elementwise ----
__global__ void __launch_bounds__(kThreads) to_bf16_kernel(const float* x, bf16* y, size_t n) {
  SB_GRID_LOOP(i, n) y[i] = __float2bfloat16(x[i]);
}
__global__ void __launch_bounds__(kThreads) add_inplace_kernel(float* x, const float* y, size_t n) {
  SB_GRID_LOOP(i, n) x[i] += y[i];
}
__global__ void __launch_bounds__(kThreads) sum_blocks_kernel(const bf16* in, int G, size_t n, bf16* out) {
  SB_GRID_LOOP(i, n) {
    float s = 0.f;
    for (int m = 0; m < G; ++m) s = __fadd_rn(s, __bfloat162float(in[size_t(m) * n + i]));  // no contraction
    out[i] = __float2bfloat16(s);
  }
}
__global__ void __launch_bounds__(kThreads) scale_inplace_kernel(float* x, float c, size_t n) {
  SB_GRID_LOOP(i, n) x[i] *= c;
}

// sum x^2: each CTA writes its partial (double) to part[blockIdx.x]; a second one-CTA kernel adds
// the partials in a fixed order (no atomics: the result is deterministic for a given n).
__global__ void __launch_bounds__(kThreads) sum_squares_kernel(const float* x, size_t n, double* part) {
  double acc = 0;
  SB_GRID_LOOP(i, n) {
    const double xi = x[i];
    acc += xi * xi;  // exact: a float squared fits in a double
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
constexpr int kSumThreads = 1024;
__global__ void __launch_bounds__(kSumThreads) sum_partials_kernel(const double* part, int nparts, double* out) {
  double acc = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += part[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

#undef SB_GRID_LOOP

}  // namespace

// ---- host launchers ----

void rmsnorm_fwd(const float* x, const float* w, bf16* y, float* rstd, int N, int C, float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_fwd_kernel<<<N, kThreads, 0, stream>>>(x, w, y, rstd, C, eps);
  SB_CUDA_CHECK_LAUNCH("rmsnorm_fwd_kernel");
}

void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw, int N,
                 int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (dx) {
    rmsnorm_bwd_dx_kernel<<<N, kThreads, 0, stream>>>(x, w, rstd, dy, dx, C);
    SB_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dx_kernel");
  }
  if (dw) {
    // 256 rows per CTA, more when N would need over 65535 chunks (gridDim.y limit).
    const int chunk = std::max(256, (N + 65534) / 65535);
    const dim3 grid((C + 31) / 32, (N + chunk - 1) / chunk);
    rmsnorm_bwd_dw_kernel<<<grid, dim3(32, kDwRows), 0, stream>>>(x, rstd, dy, dw, N, C, chunk);
    SB_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dw_kernel");
  }
}

static void rope_launch(bf16* x, const int32_t* pos, int N, int nh, int D, RopeFreqs rope, float sign,
                        cudaStream_t stream) {
  const int64_t pairs = int64_t(N) * (D / 2);
  if (pairs <= 0 || nh <= 0) return;
  rope_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(x, pos, N, nh, D, rope, sign);
  SB_CUDA_CHECK_LAUNCH("rope_kernel");
}
void rope_fwd(bf16* x, const int32_t* pos, int N, int nh, int D, RopeFreqs rope, cudaStream_t stream) {
  rope_launch(x, pos, N, nh, D, rope, +1.0f, stream);
}
void rope_bwd(bf16* dx, const int32_t* pos, int N, int nh, int D, RopeFreqs rope, cudaStream_t stream) {
  rope_launch(dx, pos, N, nh, D, rope, -1.0f, stream);  // rotation is orthogonal: grad = inverse
}

void swiglu_fwd(const bf16* gate, const bf16* up, bf16* h, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_fwd_kernel<<<grid_for(int64_t(n)), kThreads, 0, stream>>>(gate, up, h, n);
  SB_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}
void swiglu_bwd(const bf16* gate, const bf16* up, const bf16* dh, bf16* dgate, bf16* dup, size_t n,
                cudaStream_t stream) {
  if (n == 0) return;
  swiglu_bwd_kernel<<<grid_for(int64_t(n)), kThreads, 0, stream>>>(gate, up, dh, dgate, dup, n);
  SB_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

void embedding_fwd(const int32_t* ids, const float* table, float* out, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  embedding_fwd_kernel<<<grid_for(int64_t(N) * C), kThreads, 0, stream>>>(ids, table, out, N, C);
  SB_CUDA_CHECK_LAUNCH("embedding_fwd_kernel");
}
void embedding_fwd(const int32_t* ids, const bf16* table, float* out, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  embedding_fwd_kernel<<<grid_for(int64_t(N) * C), kThreads, 0, stream>>>(ids, table, out, N, C);
  SB_CUDA_CHECK_LAUNCH("embedding_fwd_kernel (bf16 table)");
}
void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  embedding_bwd_kernel<<<grid_for(int64_t(N) * C), kThreads, 0, stream>>>(ids, dout, dtable, N, C);
  SB_CUDA_CHECK_LAUNCH("embedding_bwd_kernel");
}

void adamw(float* p, bf16* p16, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, int64_t step, cudaStream_t stream) {
  if (n == 0) return;
  // bias corrections exactly as kernels::adamw: in double, then rounded to float
  const float bc1 = float(1.0 - std::pow(double(beta1), double(step)));
  const float bc2 = float(1.0 - std::pow(double(beta2), double(step)));
  adamw_kernel<<<grid_for(int64_t(n)), kThreads, 0, stream>>>(p, p16, g, m, v, n, lr, beta1, beta2, eps,
                                                              weight_decay, bc1, bc2);
  SB_CUDA_CHECK_LAUNCH("adamw_kernel");
}

void to_bf16(const float* x, bf16* y, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(int64_t(n)), kThreads, 0, stream>>>(x, y, n);
  SB_CUDA_CHECK_LAUNCH("to_bf16_kernel");
}
void add_inplace(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_inplace_kernel<<<grid_for(int64_t(n)), kThreads, 0, stream>>>(x, y, n);
  SB_CUDA_CHECK_LAUNCH("add_inplace_kernel");
}
void sum_blocks(const bf16* in, int G, size_t n, bf16* out, cudaStream_t stream) {
  if (n == 0) return;
  sum_blocks_kernel<<<grid_for(int64_t(n)), kThreads, 0, stream>>>(in, G, n, out);
  SB_CUDA_CHECK_LAUNCH("sum_blocks_kernel");
}
void scale_inplace(float* x, float c, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_inplace_kernel<<<grid_for(int64_t(n)), kThreads, 0, stream>>>(x, c, n);
  SB_CUDA_CHECK_LAUNCH("scale_inplace_kernel");
}

double sum_squares(const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return 0.0;
  const unsigned blocks = grid_for(int64_t(n));
  // partials (blocks) then the total, stream-ordered scratch (no device-wide sync of cudaMalloc)
  double* buf = nullptr;
  SB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), (blocks + 1) * sizeof(double), stream));
  sum_squares_kernel<<<blocks, kThreads, 0, stream>>>(x, n, buf);
  SB_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  sum_partials_kernel<<<1, kSumThreads, 0, stream>>>(buf, int(blocks), buf + blocks);
  SB_CUDA_CHECK_LAUNCH("sum_partials_kernel");
  double total = 0;
  SB_CUDA_CHECK(cudaMemcpyAsync(&total, buf + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream));
  SB_CUDA_CHECK(cudaFreeAsync(buf, stream));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return total;
}

}  // namespace sb::kernels::cuda
