// Warp and CTA sums shared by the per-row kernels (ops.cu, fused.cu). Device code only.
#pragma once

namespace sb::kernels::cuda {

template <class T>
__device__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the CTA, returned to every thread. blockDim.x a multiple of 32, at most 1024.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T sh[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read by a previous block_sum of this CTA
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : T(0);
  return warp_sum(v);  // every warp reduces the same partials: all threads get the total
}

// The rmsnorm backward's row coefficient, r^3/C * sum_c dy*w*x (sum in double), for one row xt, dyt
// (C) with rstd rd: dx = r*dy*w - x * coefficient. Every thread of the CTA gets it.
__device__ inline float rmsnorm_bwd_coef(const float* xt, const float* dyt, const float* w, double rd, int C) {
  double dot = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dot += double(dyt[c]) * w[c] * xt[c];
  dot = block_sum(dot);
  return float(dot * rd * rd * rd / C);
}

}  // namespace sb::kernels::cuda
