// The gating kernels shared by the host-built selection (gating.cu) and the device-built one
// (select_device.cu); see gating.cu for what they compute.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_cuda.hpp"

// Internal linkage: each including .cu file gets its own copy of the kernels.
namespace sb::kernels::cuda::gating {
namespace {

// Query vectors staged in shared memory per pass of the row kernel (per-token query: the block's
// tokens x group heads, TQ at a time; mean query: qbar, one).
constexpr int kTQ = 8;

// Summaries of block bi for kv head g, one thread per dimension: qbar (mean query only; null: not
// pooled) over tokens x group heads, and the key summary kbar (R rows of D) as kernels/cpu/gating.cpp
// pool_key: mean (R = 1, u = the block size), per-dimension max then min (key = bounds, R = 2), or
// the means of R sub-blocks of u tokens (key = sub; a short block's empty sub-blocks repeat its last).
__global__ void pool_kernel(const bf16* q, const bf16* k, const BlockInfo* blocks, int H, int Hkv, int D, int key,
                            int R, int u, double* qbar, double* kbar) {
  const int bi = blockIdx.x, g = blockIdx.y, G = H / Hkv;
  const BlockInfo b = blocks[bi];
  auto kv = [&](int t, int d) { return double(__bfloat162float(k[(int64_t(t) * Hkv + g) * D + d])); };
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    if (qbar) {
      double qs = 0.0;
      for (int t = b.t0; t < b.t0 + b.len; t++)
        for (int h = g * G; h < (g + 1) * G; h++) qs = __dadd_rn(qs, double(__bfloat162float(q[(int64_t(t) * H + h) * D + d])));
      qbar[(size_t(bi) * Hkv + g) * D + d] = qs / (double(b.len) * G);
    }
    double* o = kbar + (size_t(bi) * Hkv + g) * R * D + d;
    if (key == int(GateKey::bounds)) {
      double hi = -INFINITY, lo = INFINITY;
      for (int t = b.t0; t < b.t0 + b.len; t++) hi = fmax(hi, kv(t, d)), lo = fmin(lo, kv(t, d));
      o[0] = hi, o[D] = lo;
      continue;
    }
    for (int r = 0; r < R; r++) {
      const int re = min(r, (b.len - 1) / u), a = b.t0 + re * u, e = b.t0 + min((re + 1) * u, b.len);
      double ks = 0.0;
      for (int t = a; t < e; t++) ks = __dadd_rn(ks, kv(t, d));
      o[size_t(r) * D] = ks / double(e - a);
    }
  }
}

struct RowParams {
  const BlockInfo* blocks;
  const int32_t* block_base;  // (ndocs): index of a doc's first block in blocks
  const int64_t* row_base;    // (ndocs + 1)
  const double *qbar, *kbar;
  int Hkv, D, k, w, cap;
  double theta, scale;
  int32_t* out_cols;  // (rows, cap)
  int32_t* out_cnt;   // (rows)
  float* out_recall;  // (rows)
  // Device selection (select_device.cu) only, else null: the budget k_dev[layer] replaces k, and
  // each kept (i, j) sets bit i of column j's row of col_bits (rows, words) and counts it in col_cnt.
  const int32_t* k_dev;
  int layer, words;
  uint32_t* col_bits;
  int32_t* col_cnt;
  // Gate mode (GatingParams): per_token, the query side is q's tokens x group heads (max) instead of
  // qbar (mean); key and R, the key summaries' kind and rows.
  const bf16* q;
  int H, per_token, key, R;
};

// Shared memory of row_kernel: kTQ query vectors, then nb scores (double), then nb keep flags.
inline size_t row_smem_bytes(int D, int max_nb) { return size_t(kTQ) * D * sizeof(double) + size_t(max_nb) * (sizeof(double) + 1); }

// The best dot of nt <= TQ query vectors qs (nt, D) with one key block's summary kj (R, D): each
// dot summed over d ascending (bounds: sum_d max(q_d hi_d, q_d lo_d)), the TQ dots in registers so
// kj is read once.
template <int TQ>
__device__ double best_dot(const double* qs, int nt, const double* kj, int D, int R, bool bounds) {
  double best = -INFINITY;
  for (int r = 0; r < (bounds ? 1 : R); r++) {
    double acc[TQ];
#pragma unroll
    for (int t = 0; t < TQ; t++) acc[t] = 0.0;
    for (int d = 0; d < D; d++) {
      const double hi = kj[size_t(r) * D + d], lo = bounds ? kj[D + d] : 0.0;
#pragma unroll
      for (int t = 0; t < TQ; t++)
        if (t < nt) {
          const double x = qs[t * D + d];
          acc[t] = __dadd_rn(acc[t], bounds ? fmax(__dmul_rn(x, hi), __dmul_rn(x, lo)) : __dmul_rn(x, hi));
        }
    }
#pragma unroll
    for (int t = 0; t < TQ; t++)
      if (t < nt) best = fmax(best, acc[t]);
  }
  return best;
}

__global__ void row_kernel(const RowParams p) {
  extern __shared__ double smem[];  // row_smem_bytes
  const BlockInfo b = p.blocks[blockIdx.x];
  const int g = blockIdx.y, i = b.i, nb = b.nb, D = p.D, G = p.H / p.Hkv;
  double* qs = smem;  // (kTQ, D) query vectors of this pass
  double* sc = smem + kTQ * D;
  char* keep = reinterpret_cast<char*>(sc + nb);
  const int base = p.block_base[b.doc];
  // s_ij = (best over query vectors v and key rows r of the dot) * scale, every dot summed over d
  // ascending as the CPU does; a thread per j keeps kTQ dots in registers so kbar_j is read once
  // per pass, the query vectors are broadcast from shared memory.
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sc[j] = -INFINITY;
  const int nv = p.per_token ? b.len * G : 1;
  const bool bounds = p.key == int(GateKey::bounds);
  for (int v0 = 0; v0 < nv; v0 += kTQ) {
    const int nt = min(kTQ, nv - v0);
    __syncthreads();  // the previous pass's vectors are read
    for (int e = threadIdx.x; e < nt * D; e += blockDim.x) {
      const int v = v0 + e / D, d = e % D;
      qs[e] = p.per_token ? double(__bfloat162float(p.q[(int64_t(b.t0 + v / G) * p.H + g * G + v % G) * D + d]))
                          : p.qbar[(size_t(base + i) * p.Hkv + g) * D + d];
    }
    __syncthreads();
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
      const double* kj = p.kbar + (size_t(base + j) * p.Hkv + g) * p.R * D;
      // one vector (the mean query, or a last pass of one): the plain loop, no idle lanes of kTQ
      const double best = nt == 1 ? best_dot<1>(qs, 1, kj, D, p.R, bounds) : best_dot<kTQ>(qs, nt, kj, D, p.R, bounds);
      sc[j] = fmax(sc[j], best);
    }
  }
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sc[j] = __dmul_rn(sc[j], p.scale);
  __syncthreads();
  // anchor score a_i (max is order-independent)
  double a = -INFINITY;
  for (int j = 0; j <= i; j++)
    if (j == 0 || j == i || j >= i - p.w) a = fmax(a, sc[j]);
  const double thr = a - p.theta;
  const int kk = p.k_dev ? max(p.k_dev[p.layer], 0) : p.k;
  const int64_t col0 = p.row_base[b.doc] + int64_t(g) * nb;  // row (= column) index of block 0
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const bool anchor = j == 0 || j == i || j >= i - p.w;
    bool kept = anchor;
    if (!anchor && sc[j] >= thr && kk > 0) {
      int rank = 0;
      const double sj = sc[j];
      for (int c = 1; c < i && rank < kk; c++) {
        const bool cand = !(c >= i - p.w) && sc[c] >= thr;
        if (cand && (sc[c] > sj || (sc[c] == sj && c < j))) rank++;
      }
      kept = rank < kk;
    }
    keep[j] = kept;
    if (kept && p.col_bits) {
      atomicOr(p.col_bits + (col0 + j) * p.words + i / 32, 1u << (i % 32));
      atomicAdd(p.col_cnt + col0 + j, 1);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double mx = -INFINITY;
    for (int j = 0; j <= i; j++) mx = fmax(mx, sc[j]);
    double z = 0.0;
    for (int j = 0; j <= i; j++) z = __dadd_rn(z, exp(__dsub_rn(sc[j], mx)));
    const int64_t row = p.row_base[b.doc] + int64_t(g) * nb + i;
    int32_t* cols = p.out_cols + row * p.cap;
    int n = 0;
    double r = 0.0;
    for (int j = 0; j <= i; j++)
      if (keep[j]) {
        cols[n++] = j;
        r = __dadd_rn(r, exp(__dsub_rn(sc[j], mx)) / z);
      }
    p.out_cnt[row] = n;
    p.out_recall[row] = float(fmin(1.0, r));
  }
}

}  // namespace
}  // namespace sb::kernels::cuda::gating
