// The gating kernels shared by the host-built selection (gating.cu) and the device-built one
// (select_device.cu); see gating.cu for what they compute. The per-token query's score stage is
// its own kernel (gate_score.cu), run between pool_kernel and row_kernel.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/gate_score.cuh"

// Internal linkage: each including .cu file gets its own copy of the kernels.
namespace sb::kernels::cuda::gating {
namespace {

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
  // Gate mode (GatingParams): the per-token query's scores (token_scores, gate_score.cuh: null for
  // the mean query, which scores qbar here) at pair_base; key and R, the key summaries' kind and rows.
  const uint32_t* tok_score;
  const int64_t* pair_base;
  int key, R;
};

// Shared memory of row_kernel: qbar_i (D doubles), then nb scores (double), then nb keep flags.
inline size_t row_smem_bytes(int D, int max_nb) { return size_t(D) * sizeof(double) + size_t(max_nb) * (sizeof(double) + 1); }

// The mean query's dot with one key block's summary kj (R, D), in double as kernels/cpu/gating.cpp
// summary_dot: the best row's dot, each summed over d ascending (bounds: sum_d max(q_d hi_d, q_d lo_d)).
__device__ double summary_dot(const double* qv, const double* kj, int D, int R, bool bounds) {
  if (bounds) {
    double acc = 0.0;
    for (int d = 0; d < D; d++) acc = __dadd_rn(acc, fmax(__dmul_rn(qv[d], kj[d]), __dmul_rn(qv[d], kj[D + d])));
    return acc;
  }
  double best = -INFINITY;
  for (int r = 0; r < R; r++) {
    double acc = 0.0;
    for (int d = 0; d < D; d++) acc = __dadd_rn(acc, __dmul_rn(qv[d], kj[size_t(r) * D + d]));
    best = fmax(best, acc);
  }
  return best;
}

__global__ void row_kernel(const RowParams p) {
  extern __shared__ double smem[];  // row_smem_bytes
  const BlockInfo b = p.blocks[blockIdx.x];
  const int g = blockIdx.y, i = b.i, nb = b.nb, D = p.D;
  double* qs = smem;  // (D) qbar_i
  double* sc = smem + D;
  char* keep = reinterpret_cast<char*>(sc + nb);
  const int base = p.block_base[b.doc];
  // s_ij = (the best dot) * scale. Per-token query: the score stage's float max, read back. Mean
  // query: qbar_i . summary_j in double, a thread per j, qbar_i broadcast from shared memory.
  if (p.tok_score) {
    const uint32_t* ts = p.tok_score + p.pair_base[b.doc] + g * (int64_t(nb) * (nb + 1) / 2) + int64_t(i) * (i + 1) / 2;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) sc[j] = __dmul_rn(double(score_value(ts[j])), p.scale);
  } else {
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = p.qbar[(size_t(base + i) * p.Hkv + g) * D + d];
    __syncthreads();
    for (int j = threadIdx.x; j <= i; j += blockDim.x)
      sc[j] = __dmul_rn(summary_dot(qs, p.kbar + (size_t(base + j) * p.Hkv + g) * p.R * D, D, p.R, p.key == int(GateKey::bounds)),
                        p.scale);
  }
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
