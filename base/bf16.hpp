// bfloat16 as its 16 bits on the host (safetensors' BF16 tensors, the GPU's bf16 rows staged
// through host memory): exact widening, and round-to-nearest-even narrowing (exact for values that
// came from bf16; a NaN stays a quiet NaN).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace sb {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);  // stays a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);                         // round to nearest, ties to even
  return uint16_t(u >> 16);
}

}  // namespace sb
