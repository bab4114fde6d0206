// LoRA dropout's mask (lora.dropout, src/model/README.md "LoRA"), one definition for the CPU and
// the GPU so both drop the same elements: a counter-based hash of (key, element), no state. The key
// names the draw: the run's seed, the step, the rank and micro-batch, the layer and the target
// (dropout_key); element i is row * in + column of the adapter's input x (N, in). PEFT applies it
// to the adapter's input only: y = W x + scale B A (mask * x / (1 - p)).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SB_HOST_DEVICE __host__ __device__
#else
#define SB_HOST_DEVICE
#endif

namespace sb::kernels {

SB_HOST_DEVICE inline uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Drop probability p in [0, 1) as an integer threshold: element i is kept when its 32-bit draw is
// at or above it (integers only, so the CPU and the GPU agree bit for bit).
inline uint32_t dropout_threshold(double p) {
  const double t = p * 4294967296.0;
  return t >= 4294967295.0 ? 4294967295u : uint32_t(t);
}
SB_HOST_DEVICE inline bool dropout_keep(uint64_t key, uint64_t i, uint32_t threshold) {
  return uint32_t(mix64(key ^ mix64(i + 0x9E3779B97F4A7C15ull)) >> 32) >= threshold;
}
// The key of one adapter's draw: run seed, step, rank, the micro-batch's index on that rank, layer
// and target (q .. down: 0 .. 6).
inline uint64_t dropout_key(uint64_t micro_batch_key, int layer, int target) {
  return mix64(micro_batch_key ^ mix64(uint64_t(layer) * 8 + uint64_t(target) + 1));
}
inline uint64_t dropout_micro_batch_key(uint64_t seed, int64_t step, int rank, int micro_batch) {
  uint64_t k = mix64(seed ^ 0x4C6F524144726F70ull);  // "LoRADrop"
  k = mix64(k ^ uint64_t(step));
  k = mix64(k ^ uint64_t(rank));
  return mix64(k ^ uint64_t(micro_batch));
}

}  // namespace sb::kernels
