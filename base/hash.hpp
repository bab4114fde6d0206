// FNV-1a hashes: the checkpoint checksum (io/checkpoint) and the per-step weight sync check of
// both engines (src/train).
#pragma once
#include <cstddef>
#include <cstdint>

namespace sb {

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);
// FNV-1a over the floats' 32-bit patterns (the per-step sync check of the weights): any changed bit
// changes it, like the bytewise fnv1a, in a quarter of the steps.
uint64_t fnv1a_words(const float* data, size_t n_floats, uint64_t h = 1469598103934665603ull);

}  // namespace sb
