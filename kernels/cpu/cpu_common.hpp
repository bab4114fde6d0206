// Private helpers of the CPU kernels: the Kokkos host loop and document/block geometry.
#pragma once
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"

namespace sb::kernels::cpu {

using HostPolicy = Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>;

// parallel_for over [0, n) on the host execution space (Serial here, threads elsewhere); every
// caller writes disjoint outputs per index so the loops stay race-free when threaded.
template <class F>
inline void host_for(const char* name, int64_t n, const F& f) {
  if (n <= 0) return;
  Kokkos::parallel_for(name, HostPolicy(0, n), f);
}

// ---- softmax tile helpers ----
// exp(x) for the softmax arguments x <= 0 (scores minus the row max or the lse). glibc's expf is a
// scalar call (~4.4 ns each: a 64x64 tile of them cost more than the tile's two 64^3 gemms); this
// branch-free Cephes-style version vectorises at -O3 (SSE2): |rel err| < 2e-7, and 0 for x < ~-87
// (also for -inf and huge negative x, via the integer exponent test).
inline float exp_nonpos(float x) {
  const float t = x * 1.44269504088896341f + 12582912.0f;  // 1.5*2^23 + round(x / ln 2)
  const float n = t - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, ln2 split hi/lo
  const float z = r * r;
  const float p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
                    1.6666665459e-1f) * r + 5.0000001201e-1f) * z + r + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - 0x4B400000;  // the integer n
  const uint32_t bits = std::bit_cast<uint32_t>(p) + (uint32_t(e) << 23);  // p * 2^n
  const uint32_t keep = uint32_t(-int32_t(e > -126));  // all ones or zero: a mask, not a branch
  return std::bit_cast<float>(bits & keep);
}

// x[c] = exp(x[c] - shift), c < n. Double (gradient checks) keeps std::exp.
inline void exp_shifted(float* x, int n, float shift) {
  for (int c = 0; c < n; c++) x[c] = exp_nonpos(x[c] - shift);
}
inline void exp_shifted(double* x, int n, double shift) {
  for (int c = 0; c < n; c++) x[c] = std::exp(x[c] - shift);
}

// Row sum and max with 8 partial results: vectorisable without -ffast-math.
template <class T>
inline T row_sum(const T* x, int n) {
  T part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int c = 0;
  for (; c + 8 <= n; c += 8)
    for (int u = 0; u < 8; u++) part[u] += x[c + u];
  for (; c < n; c++) part[0] += x[c];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}
template <class T>
inline T row_max(const T* x, int n, T init) {
  T part[8] = {init, init, init, init, init, init, init, init};
  int c = 0;
  for (; c + 8 <= n; c += 8)
    for (int u = 0; u < 8; u++) part[u] = x[c + u] > part[u] ? x[c + u] : part[u];
  for (; c < n; c++) part[0] = x[c] > part[0] ? x[c] : part[0];
  for (int u = 1; u < 8; u++) part[0] = part[u] > part[0] ? part[u] : part[0];
  return part[0];
}

inline int num_blocks(int len, int bs) { return (len + bs - 1) / bs; }

// One query block of one document: tokens [t0, t0 + len) of the packed batch.
struct QBlock {
  int doc, i;    // document and block index inside it
  int t0, len;   // first token (global) and tokens in the block (last block may be partial)
  int nb;        // blocks of the document
};

// Every (document, query block) of the batch, in selection-row order.
inline std::vector<QBlock> query_blocks(const int32_t* cu_seqlens, int ndocs, int bs) {
  std::vector<QBlock> out;
  for (int d = 0; d < ndocs; d++) {
    int L = cu_seqlens[d + 1] - cu_seqlens[d];
    int nb = num_blocks(L, bs);
    for (int i = 0; i < nb; i++)
      out.push_back({d, i, cu_seqlens[d] + i * bs, std::min(bs, L - i * bs), nb});
  }
  return out;
}

}  // namespace sb::kernels::cpu
