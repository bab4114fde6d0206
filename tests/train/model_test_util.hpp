// Helpers shared by test_model's sources (test_model.cpp, test_lora.cpp): a tiny model's dimensions
// and a packed batch of random documents.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "src/model/model.hpp"

namespace sbtest {

inline sb::ModelDims tiny_dims(bool tied, bool qkv_bias = false) {
  sb::ModelDims d;
  d.qkv_bias = qkv_bias;
  d.n_layers = 2, d.d_model = 16, d.n_heads = 4, d.n_kv_heads = 2, d.head_dim = 4, d.ffn_dim = 24, d.vocab = 23;
  d.tied = tied;
  d.init_std = 0.3;  // large weights so every path carries gradient worth checking
  return d;
}

inline sb::PackedBatch random_batch(std::vector<int> lens, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  sb::PackedBatch b;
  for (int L : lens) {
    std::vector<uint32_t> seq(L);
    for (auto& t : seq) t = uint32_t(rng() % vocab);
    b.add(seq);
  }
  return b;
}

}  // namespace sbtest
