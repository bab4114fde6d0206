// Tensor maps (TMA descriptors) over the attention tensors: a (rows, heads, head_dim) bf16 array,
// loaded as boxes of box_rows x 64 columns of one head, 128-byte swizzled in shared memory: the
// layout wgmma.cuh's sw128 names (one 64-column panel per TMA load). Zero-filled past `rows` on
// loads; TMA stores through the same map (the backward's dK, dV) are clipped there.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace sb::kernels::cuda {
CUtensorMap tile_map(const void* base, int64_t rows, int heads, int head_dim, int box_rows);
}  // namespace sb::kernels::cuda
