#include "base/hash.hpp"

#include <cstring>

namespace sb {

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  auto p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t fnv1a_words(const float* data, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, data + i, sizeof w);
    h = (h ^ w) * 1099511628211ull;
  }
  return h;
}

}  // namespace sb
