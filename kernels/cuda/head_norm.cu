// Qwen3's q_norm / k_norm: RMSNorm over each head's D values of q and k (weight (D), shared by the
// heads), applied before RoPE. One warp per (token, head); rows of nh heads at a row stride, so the
// same kernels run on the separate q, k arrays and on the column blocks of the packed q|k|v.
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/cuda/reduce.cuh"

namespace sb::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps: 8 (token, head) rows per CTA

unsigned grid_rows(int64_t rows) { return unsigned((rows + kThreads / 32 - 1) / (kThreads / 32)); }

// x (N rows at stride ld, nh heads of D each) bf16 in place: y = bf16(x * r) * w, as transformers'
// RMSNorm (the normed value rounded to the input's type, then the weight); xs (N*nh, D) the input
// kept for the backward, rstd (N*nh).
__global__ void __launch_bounds__(kThreads) head_rmsnorm_fwd_kernel(bf16* x, int64_t ld, const float* w, bf16* xs,
                                                                     float* rstd, int N, int nh, int D, float eps) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= int64_t(N) * nh) return;  // whole warps leave together
  bf16* xr = x + (row / nh) * ld + (row % nh) * D;  // (D)
  float ss = 0;
  for (int d = lane; d < D; d += 32) {
    const float v = __bfloat162float(xr[d]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(D) + eps);
  if (lane == 0) rstd[row] = r;
  for (int d = lane; d < D; d += 32) {
    const bf16 v = xr[d];
    xs[row * D + d] = v;
    xr[d] = __float2bfloat16(__bfloat162float(__float2bfloat16(__bfloat162float(v) * r)) * w[d]);
  }
}

// dw[d] += sum over rows of dy * x * r: one CTA per d (deterministic: a fixed order of sums).
__global__ void __launch_bounds__(kThreads) head_rmsnorm_dw_kernel(const bf16* dy, int64_t ld, const bf16* xs,
                                                                    const float* rstd, float* dw, int N, int nh,
                                                                    int D) {
  const int d = blockIdx.x;
  float acc = 0;
  for (int64_t row = threadIdx.x; row < int64_t(N) * nh; row += blockDim.x)
    acc += __bfloat162float(dy[(row / nh) * ld + (row % nh) * D + d]) * __bfloat162float(xs[row * D + d]) * rstd[row];
  acc = block_sum(acc);
  if (threadIdx.x == 0) dw[d] += acc;
}

// dx = r*(dy*w) - x * r^3/D * sum(dy*w*x), written over dy (the rows at stride ld).
__global__ void __launch_bounds__(kThreads) head_rmsnorm_dx_kernel(bf16* dy, int64_t ld, const bf16* xs,
                                                                    const float* w, const float* rstd, int N, int nh,
                                                                    int D) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= int64_t(N) * nh) return;
  bf16* g = dy + (row / nh) * ld + (row % nh) * D;  // (D)
  const bf16* xr = xs + row * D;
  float dot = 0;
  for (int d = lane; d < D; d += 32) dot += __bfloat162float(g[d]) * w[d] * __bfloat162float(xr[d]);
  dot = warp_sum(dot);
  const float r = rstd[row], k = dot * r * r * r / float(D);
  __syncwarp();
  for (int d = lane; d < D; d += 32)
    g[d] = __float2bfloat16(r * __bfloat162float(g[d]) * w[d] - __bfloat162float(xr[d]) * k);
}

}  // namespace

void head_rmsnorm_fwd(bf16* x, int64_t ld, const float* w, bf16* xs, float* rstd, int N, int nh, int D, float eps,
                      cudaStream_t stream) {
  if (N <= 0 || nh <= 0) return;
  head_rmsnorm_fwd_kernel<<<grid_rows(int64_t(N) * nh), kThreads, 0, stream>>>(x, ld, w, xs, rstd, N, nh, D, eps);
  SB_CUDA_CHECK_LAUNCH("head_rmsnorm_fwd_kernel");
}

void head_rmsnorm_bwd(bf16* dy, int64_t ld, const bf16* xs, const float* w, const float* rstd, float* dw, int N,
                      int nh, int D, cudaStream_t stream) {
  if (N <= 0 || nh <= 0) return;
  if (dw) {  // nullptr: a frozen weight (LoRA's base)
    head_rmsnorm_dw_kernel<<<D, kThreads, 0, stream>>>(dy, ld, xs, rstd, dw, N, nh, D);  // before dy is overwritten
    SB_CUDA_CHECK_LAUNCH("head_rmsnorm_dw_kernel");
  }
  head_rmsnorm_dx_kernel<<<grid_rows(int64_t(N) * nh), kThreads, 0, stream>>>(dy, ld, xs, w, rstd, N, nh, D);
  SB_CUDA_CHECK_LAUNCH("head_rmsnorm_dx_kernel");
}

}  // namespace sb::kernels::cuda
