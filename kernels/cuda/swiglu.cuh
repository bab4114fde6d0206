// SwiGLU's per-element math, shared by ops.cu's scalar kernels and fused.cu's 16-byte ones (same
// expressions, so both give the same bits). Device code only; math in fp32.
#pragma once

namespace sb::kernels::cuda {

// h = silu(g) * u, silu(g) = g * sigmoid(g).
__device__ inline float swiglu_h(float g, float u) {
  const float sig = 1.0f / (1.0f + expf(-g));
  return g * sig * u;
}

// silu'(g) = sig * (1 + g*(1-sig)): dgate = dh * u * silu'(g), dup = dh * silu(g).
__device__ inline void swiglu_grads(float g, float u, float d, float& dg, float& du) {
  const float sig = 1.0f / (1.0f + expf(-g));
  dg = d * u * sig * __fmaf_rn(g, 1.0f - sig, 1.0f);  // explicit fma: the same bits in every kernel
  du = d * g * sig;
}

}  // namespace sb::kernels::cuda
