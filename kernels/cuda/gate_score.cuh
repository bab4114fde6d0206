// The per-token query's score stage (gate_score.cu), shared by gating.cu and select_device.cu
// through gating_kernels.cuh. Scores of (doc, kv head g, query block i, key block j <= i) at
//   pair_base[doc] + g nb (nb + 1) / 2 + i (i + 1) / 2 + j        (nb: the doc's blocks)
// each the max dot as an order-preserving uint32 (score_key; score_value reads it back).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"

namespace sb::kernels::cuda::gating {

// One CTA's work: kSC key columns from column c0 of query block `block` (an index into the blocks).
struct ScoreTile {
  int32_t block, c0;
};

// Unsigned order = float order (finite floats; 0 is below every key, as -inf's is).
__device__ inline uint32_t score_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ inline float score_value(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// (ndocs + 1) first score of each doc, from block_base (ndocs + 1: a doc's first block).
std::vector<int64_t> pair_bases(const std::vector<int32_t>& block_base, int Hkv);
// The tiles of every query block (R key rows a block; bounds: one column of two rows).
std::vector<ScoreTile> score_tiles(const std::vector<BlockInfo>& blocks, int R, bool bounds);
// score (pair_base[ndocs] = n_pairs) from q (N, H, D) bf16 and the key summaries kbar (n_blocks,
// Hkv, R, D) in double; blocks, block_base, pair_base, tiles (n_tiles) on the device. On stream.
void token_scores(const bf16* q, const double* kbar, const BlockInfo* blocks, const int32_t* block_base,
                  const int64_t* pair_base, const ScoreTile* tiles, int n_tiles, int64_t n_pairs, int H, int Hkv,
                  int D, int R, bool bounds, uint32_t* score, cudaStream_t stream);

}  // namespace sb::kernels::cuda::gating
