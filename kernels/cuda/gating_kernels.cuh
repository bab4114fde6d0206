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

__global__ void pool_kernel(const bf16* q, const bf16* k, const BlockInfo* blocks, int H, int Hkv, int D,
                            double* qbar, double* kbar) {
  const int bi = blockIdx.x, g = blockIdx.y, G = H / Hkv;
  const BlockInfo b = blocks[bi];
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    double qs = 0.0, ks = 0.0;
    for (int t = b.t0; t < b.t0 + b.len; t++) {
      for (int h = g * G; h < (g + 1) * G; h++) qs = __dadd_rn(qs, double(__bfloat162float(q[(int64_t(t) * H + h) * D + d])));
      ks = __dadd_rn(ks, double(__bfloat162float(k[(int64_t(t) * Hkv + g) * D + d])));
    }
    const size_t o = (size_t(bi) * Hkv + g) * D + d;
    qbar[o] = qs / (double(b.len) * G);
    kbar[o] = ks / double(b.len);
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
};

__global__ void row_kernel(const RowParams p) {
  extern __shared__ double sc[];  // (nb) scores, then (nb) chars of keep flags after them
  const BlockInfo b = p.blocks[blockIdx.x];
  const int g = blockIdx.y, i = b.i, nb = b.nb;
  char* keep = reinterpret_cast<char*>(sc + nb);
  const int base = p.block_base[b.doc];
  const double* qi = p.qbar + (size_t(base + i) * p.Hkv + g) * p.D;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const double* kj = p.kbar + (size_t(base + j) * p.Hkv + g) * p.D;
    double acc = 0.0;
    for (int d = 0; d < p.D; d++) acc = __dadd_rn(acc, __dmul_rn(qi[d], kj[d]));
    sc[j] = __dmul_rn(acc, p.scale);
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
