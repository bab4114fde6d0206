// The rotate-half RoPE step shared by ops.cu's rope kernel and fused.cu's q/k launch. Device code only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/kernels.hpp"

namespace sb::kernels::cuda {

// sin/cos of pos * inv_freq[d] (the model's table, device memory: rope.inv_freq), the angle computed
// and reduced to [-pi, pi] in double (pos reaches 1e5: a float angle would lose ~1e-2 rad), then
// sin/cos in fp32, both times rope.scale (YaRN's attention factor); sign -1: the inverse rotation.
__device__ inline void rope_sincos(int32_t pos, int d, RopeFreqs rope, float sign, float& sn, float& cs) {
  const double ang = double(pos) * rope.inv_freq[d];
  const double two_pi = 6.283185307179586476925;
  const float red = float(ang - two_pi * rint(ang / two_pi));
  sincosf(red, &sn, &cs);
  if (rope.scale != 1.0) {
    const float sc = float(rope.scale);
    sn *= sc, cs *= sc;
  }
  sn *= sign;
}

// Rotates the pair (d, d + half) of each of nh heads of one token: in (nh, D) bf16 -> out (nh, D)
// (in == out: in place). With a bias b (nh, D) fp32 (nullptr: none) each element is first
// bf16(x + b), as bias_add_fwd writes it.
__device__ inline void rope_rotate(const __nv_bfloat16* in, __nv_bfloat16* out, int nh, int D, int d, float sn,
                                   float cs, const float* b = nullptr) {
  const int half = D / 2;
  for (int h = 0; h < nh; h++) {
    const __nv_bfloat16* xh = in + int64_t(h) * D;  // (D)
    __nv_bfloat16* yh = out + int64_t(h) * D;       // (D)
    float x0 = __bfloat162float(xh[d]), x1 = __bfloat162float(xh[d + half]);
    if (b) {
      x0 = __bfloat162float(__float2bfloat16(x0 + b[h * D + d]));
      x1 = __bfloat162float(__float2bfloat16(x1 + b[h * D + d + half]));
    }
    // explicit fma: every kernel that rotates rounds the same way (fused.cu's must equal ops.cu's)
    yh[d] = __float2bfloat16(__fmaf_rn(x0, cs, -__fmul_rn(x1, sn)));
    yh[d + half] = __float2bfloat16(__fmaf_rn(x1, cs, __fmul_rn(x0, sn)));
  }
}

}  // namespace sb::kernels::cuda
