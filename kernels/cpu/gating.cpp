// Anchor-guided block selection (DESIGN.md, "Block-sparse attention with anchor-guided selection")
// and the dense causal selection. Cost: O(N*H*D) pooling + O(nblocks^2 * D * R) scores per doc-head
// (R key rows: 1 mean, 2 bounds, sub_blocks sub), times Bs * G with the per-token query (max), whose
// scores are in float (TokenScorer; the mean query's in double). Compiled with -ffp-contract=off
// (kernels/CMakeLists.txt): the CUDA twins' _rn intrinsics do the same rounded operations.
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_common.hpp"

namespace sb::kernels {

// Rows (doc, kv head, query block) in selection order: doc_row_base[d] + g*nb + i.
static void make_row_base(const int32_t* cu_seqlens, int ndocs, AttnShape s, BlockSelection& sel) {
  sel.doc_row_base.assign(ndocs + 1, 0);
  for (int d = 0; d < ndocs; d++)
    sel.doc_row_base[d + 1] =
        sel.doc_row_base[d] + int64_t(s.n_kv_heads) * cpu::num_blocks(cu_seqlens[d + 1] - cu_seqlens[d], s.block_size);
}

// The key summary of kv head g over the block's tokens [t0, t0 + n), kb (R, D) in double: mean, the
// mean of the rows; bounds, the max row then the min row; sub, each sub-block's mean (sub-blocks of
// Bs / R tokens; a short last block's empty sub-blocks repeat its last one, which leaves the max).
template <class T>
static void pool_key(const T* k, int t0, int n, int g, int Hkv, AttnShape s, GatingParams p, double* kb) {
  const int D = s.head_dim, R = key_summary_rows(p, s.block_size);
  auto row = [&](int t) { return k + (int64_t(t) * Hkv + g) * D; };
  if (p.key == GateKey::bounds) {
    for (int d = 0; d < D; d++) kb[d] = -std::numeric_limits<double>::infinity(), kb[D + d] = -kb[d];
    for (int t = t0; t < t0 + n; t++)
      for (int d = 0; d < D; d++) kb[d] = std::max(kb[d], double(row(t)[d])), kb[D + d] = std::min(kb[D + d], double(row(t)[d]));
    return;
  }
  const int u = p.key == GateKey::sub ? s.block_size / R : n;  // tokens per sub-block
  for (int r = 0; r < R; r++) {
    const int re = std::min(r, (n - 1) / u), a = t0 + re * u, e = t0 + std::min((re + 1) * u, n);
    double* o = kb + size_t(r) * D;
    for (int d = 0; d < D; d++) o[d] = 0.0;
    for (int t = a; t < e; t++)
      for (int d = 0; d < D; d++) o[d] += row(t)[d];
    for (int d = 0; d < D; d++) o[d] /= double(e - a);
  }
}

// The dot of one query vector qv (D) with block j's summary kj (R, D): the best row's dot (mean,
// sub), or sum_d max(q_d*kmax_d, q_d*kmin_d) (bounds). Summed over d ascending (the CUDA twin, in
// gating_kernels.cuh, does the same operations in the same order).
static double summary_dot(const double* qv, const double* kj, int D, int R, GateKey key) {
  if (key == GateKey::bounds) {
    double acc = 0;
    for (int d = 0; d < D; d++) acc += std::max(qv[d] * kj[d], qv[d] * kj[D + d]);
    return acc;
  }
  double best = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < R; r++) {
    double acc = 0;
    for (int d = 0; d < D; d++) acc += qv[d] * kj[size_t(r) * D + d];
    best = std::max(best, acc);
  }
  return best;
}

// The per-token query's score stage (gate_token_scores in kernels.hpp) of one (doc, kv head), in
// float with no FMA contraction (this file is compiled with -ffp-contract=off): each dot a sequential
// sum over d of rounded products, as the CUDA twin's threads do (kernels/cuda/gate_score.cu), so the
// two agree bit for bit. The key rows are transposed to columns c = j Rc + r (d-major), so the loop
// over c is contiguous and vectorises; every column's dot still runs over d ascending.
struct TokenScorer {
  int D, Rc, ncols;
  bool bounds;
  std::vector<float> hi, lo, acc, best;  // hi, lo (D, ncols): the key rows (bounds: max and min rows)

  TokenScorer(const double* kbar, int kstride, int nb, int D_, int R, GateKey key)
      : D(D_), Rc(key == GateKey::bounds ? 1 : R), ncols(nb * Rc), bounds(key == GateKey::bounds) {
    hi.resize(size_t(D) * ncols), acc.resize(ncols), best.resize(ncols);
    if (bounds) lo.resize(hi.size());
    for (int j = 0; j < nb; j++)
      for (int r = 0; r < Rc; r++)
        for (int d = 0; d < D; d++) {
          const double* kj = kbar + size_t(j) * kstride;
          hi[size_t(d) * ncols + j * Rc + r] = float(kj[size_t(r) * D + d]);
          if (bounds) lo[size_t(d) * ncols + j] = float(kj[D + d]);
        }
  }
  // out[j], j <= i: the best dot of query block i's vectors (tokens [t0, t0 + n) x heads of group g,
  // q rows of H heads) with block j's key rows.
  template <class T>
  void row(const T* q, int t0, int n, int g, int H, int G, int i, float* out) {
    const int nc = (i + 1) * Rc;
    std::fill(best.begin(), best.begin() + nc, -std::numeric_limits<float>::infinity());
    for (int t = t0; t < t0 + n; t++)
      for (int h = g * G; h < (g + 1) * G; h++) {
        const T* qv = q + (int64_t(t) * H + h) * D;
        std::fill(acc.begin(), acc.begin() + nc, 0.0f);
        for (int d = 0; d < D; d++) {
          const float x = float(qv[d]);
          const float* hd = &hi[size_t(d) * ncols];
          if (bounds) {
            const float* ld = &lo[size_t(d) * ncols];
            for (int c = 0; c < nc; c++) acc[c] += std::max(x * hd[c], x * ld[c]);
          } else {
            for (int c = 0; c < nc; c++) acc[c] += x * hd[c];
          }
        }
        for (int c = 0; c < nc; c++) best[c] = std::max(best[c], acc[c]);
      }
    for (int j = 0; j <= i; j++) {
      float m = best[size_t(j) * Rc];
      for (int r = 1; r < Rc; r++) m = std::max(m, best[size_t(j) * Rc + r]);
      out[j] = m;
    }
  }
};

// Gate one (doc, kv head): fills cols of its rows (row r at lists[r - base]) and recall. Block j's
// key summary is kbar + j * kstride (R*D values); null kbar: pooled here from k. Non-empty `only`
// (flags, nb): only those query blocks are gated (pooled and scored); the other rows stay empty.
template <class T>
static void gate_doc_head(const T* q, const T* k, const double* kbar_in, int kstride, int t_begin, int L, int g,
                          AttnShape s, GatingParams p, std::span<const char> only, std::vector<int32_t>* lists,
                          float* recall) {
  auto gated = [&](int i) { return only.empty() || only[size_t(i)]; };
  const int H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, Bs = s.block_size;
  const int G = H / Hkv, nb = cpu::num_blocks(L, Bs), R = key_summary_rows(p, Bs);
  const bool per_token = p.query == GateQuery::max;
  // Mean query: qbar (nb, D) in double over tokens x group heads. Per-token query: the score stage
  // in float (TokenScorer). Key summaries kbar (nb, R, D).
  std::vector<double> qbar(per_token ? 0 : size_t(nb) * D, 0.0), kpool;
  if (!kbar_in) {
    kpool.resize(size_t(nb) * R * D);
    for (int b = 0; b < nb; b++)
      pool_key(k, t_begin + b * Bs, std::min(Bs, L - b * Bs), g, Hkv, s, p, &kpool[size_t(b) * R * D]);
    kbar_in = kpool.data(), kstride = R * D;
  }
  for (int b = 0; b < nb && !per_token; b++) {
    if (!gated(b)) continue;
    int t0 = t_begin + b * Bs, n = std::min(Bs, L - b * Bs);
    double* qb = &qbar[size_t(b) * D];
    for (int t = t0; t < t0 + n; t++)
      for (int h = g * G; h < (g + 1) * G; h++) {
        const T* qt = q + (int64_t(t) * H + h) * D;
        for (int d = 0; d < D; d++) qb[d] += qt[d];
      }
    for (int d = 0; d < D; d++) qb[d] /= double(n) * G;
  }
  std::optional<TokenScorer> scorer;
  std::vector<float> tok(per_token ? nb : 0);  // one row's per-token scores
  if (per_token) scorer.emplace(kbar_in, kstride, nb, D, R, p.key);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> sc(nb), prob(nb);
  std::vector<char> keep(nb);
  std::vector<int> cand;
  for (int i = 0; i < nb; i++) {
    if (!gated(i)) continue;
    // s_ij (j <= i) and p_ij = softmax_j s_ij
    if (per_token) scorer->row(q, t_begin + i * Bs, std::min(Bs, L - i * Bs), g, H, G, i, tok.data());
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j <= i; j++) {
      sc[j] = (per_token ? double(tok[j]) : summary_dot(&qbar[size_t(i) * D], kbar_in + size_t(j) * kstride, D, R, p.key)) * scale;
      mx = std::max(mx, sc[j]);
    }
    double z = 0;
    for (int j = 0; j <= i; j++) z += (prob[j] = std::exp(sc[j] - mx));
    for (int j = 0; j <= i; j++) prob[j] /= z;
    // Anchors: sink, diagonal, w local blocks; a_i = best anchor score.
    std::fill(keep.begin(), keep.begin() + i + 1, 0);
    keep[0] = keep[i] = 1;
    for (int j = std::max(0, i - p.local_blocks); j < i; j++) keep[j] = 1;
    double a = -std::numeric_limits<double>::infinity();
    for (int j = 0; j <= i; j++)
      if (keep[j]) a = std::max(a, sc[j]);
    // Candidates within theta of the anchor score, best k of them (ties -> lower j).
    cand.clear();
    for (int j = 0; j < i; j++)
      if (!keep[j] && sc[j] >= a - p.theta) cand.push_back(j);
    int nkeep = std::min<int>(std::max(p.k, 0), int(cand.size()));
    std::partial_sort(cand.begin(), cand.begin() + nkeep, cand.end(),
                      [&](int x, int y) { return sc[x] > sc[y] || (sc[x] == sc[y] && x < y); });
    for (int c = 0; c < nkeep; c++) keep[cand[c]] = 1;
    std::vector<int32_t>& cols = lists[(int64_t)g * nb + i];
    cols.clear();
    double r = 0;
    for (int j = 0; j <= i; j++)
      if (keep[j]) {
        cols.push_back(j);  // ascending by construction
        r += prob[j];
      }
    recall[(int64_t)g * nb + i] = float(std::min(1.0, r));
  }
}

// The per-row lists into CSR, and the counts (of the gated rows only: `only`, as in gate_doc_head).
static GatingStats finish(const std::vector<std::vector<int32_t>>& lists, const int32_t* cu_seqlens, int ndocs,
                          AttnShape s, BlockSelection& sel, std::span<const char> only = {}) {
  const int64_t rows = int64_t(lists.size());
  const int64_t* base = sel.doc_row_base.data();
  GatingStats st;
  sel.row_ptr.assign(rows + 1, 0);
  sel.cols.clear();
  for (int64_t r = 0; r < rows; r++) {
    sel.row_ptr[r + 1] = sel.row_ptr[r] + int64_t(lists[r].size());
    sel.cols.insert(sel.cols.end(), lists[r].begin(), lists[r].end());
  }
  for (int d = 0; d < ndocs; d++) {
    int nb = cpu::num_blocks(cu_seqlens[d + 1] - cu_seqlens[d], s.block_size);
    for (int64_t r = base[d]; r < base[d + 1]; r++) {
      int i = int((r - base[d]) % nb);
      if (!only.empty() && !only[size_t(i)]) continue;
      st.rows += 1;
      st.kept_blocks += double(lists[r].size());
      st.causal_blocks += i + 1;
      st.recall_sum += sel.recall[r];
    }
  }
  return st;
}

// q (N,H,D), k (N,Hkv,D)
template <class T>
GatingStats gate_blocks(const T* q, const T* k, const int32_t* cu_seqlens, int ndocs, AttnShape s,
                        GatingParams p, BlockSelection& sel) {
  make_row_base(cu_seqlens, ndocs, s, sel);
  const int64_t rows = sel.doc_row_base[ndocs];
  std::vector<std::vector<int32_t>> lists(rows);  // per-row kept blocks, filled in parallel
  sel.recall.assign(rows, 0.0f);
  const int64_t* base = sel.doc_row_base.data();
  float* recall = sel.recall.data();
  std::vector<int32_t>* L = lists.data();
  const int Hkv = s.n_kv_heads;
  // One task per (doc, kv head): each writes only its own rows.
  cpu::host_for("gate_blocks", int64_t(ndocs) * Hkv, [=](int64_t task) {
    int d = int(task / Hkv), g = int(task % Hkv);
    int t0 = cu_seqlens[d], len = cu_seqlens[d + 1] - t0;
    if (len <= 0) return;
    gate_doc_head(q, k, nullptr, 0, t0, len, g, s, p, {}, L + base[d], recall + base[d]);
  });
  return finish(lists, cu_seqlens, ndocs, s, sel);
}

template <class T>
void pool_block_keys(const T* k, int L, int b0, int b1, AttnShape s, GatingParams p, double* kbar) {
  const int Hkv = s.n_kv_heads, RD = key_summary_rows(p, s.block_size) * s.head_dim, Bs = s.block_size;
  for (int b = b0; b < b1; b++)
    for (int g = 0; g < Hkv; g++)
      pool_key(k, (b - b0) * Bs, std::min(Bs, L - b * Bs), g, Hkv, s, p, kbar + (size_t(b - b0) * Hkv + g) * RD);
}

template <class T>
GatingStats gate_blocks_pooled(const T* q, const double* kbar, int L, AttnShape s, GatingParams p,
                               BlockSelection& sel, const char* query_blocks) {
  const int32_t cu[2] = {0, L};
  const std::span<const char> only = query_blocks ? std::span<const char>(query_blocks, size_t(cpu::num_blocks(L, s.block_size)))
                                                  : std::span<const char>();
  make_row_base(cu, 1, s, sel);
  const int64_t rows = sel.doc_row_base[1];
  std::vector<std::vector<int32_t>> lists(rows);
  sel.recall.assign(rows, 0.0f);
  float* recall = sel.recall.data();
  std::vector<int32_t>* lp = lists.data();
  const int Hkv = s.n_kv_heads, RD = key_summary_rows(p, s.block_size) * s.head_dim;
  if (L > 0)
    cpu::host_for("gate_blocks", Hkv, [=](int64_t g) {
      gate_doc_head(q, static_cast<const T*>(nullptr), kbar + size_t(g) * RD, Hkv * RD, 0, L, int(g), s, p, only, lp, recall);
    });
  return finish(lists, cu, 1, s, sel, only);
}

template <class T>
void gate_token_scores(const T* q, const double* kbar, int kstride, int L, int g, AttnShape s, GatingParams p,
                       float* out) {
  const int Bs = s.block_size, nb = cpu::num_blocks(L, Bs), G = s.n_heads / s.n_kv_heads;
  TokenScorer sc(kbar, kstride, nb, s.head_dim, key_summary_rows(p, Bs), p.key);
  for (int i = 0; i < nb; i++) sc.row(q, i * Bs, std::min(Bs, L - i * Bs), g, s.n_heads, G, i, out + size_t(i) * nb);
}

GatingStats select_all_causal(const int32_t* cu_seqlens, int ndocs, AttnShape s, BlockSelection& sel) {
  make_row_base(cu_seqlens, ndocs, s, sel);
  const int64_t rows = sel.doc_row_base[ndocs];
  sel.row_ptr.assign(rows + 1, 0);
  sel.cols.clear();
  sel.recall.assign(rows, 1.0f);
  int64_t r = 0;
  for (int d = 0; d < ndocs; d++) {
    int nb = cpu::num_blocks(cu_seqlens[d + 1] - cu_seqlens[d], s.block_size);
    for (int g = 0; g < s.n_kv_heads; g++)
      for (int i = 0; i < nb; i++, r++) {
        for (int j = 0; j <= i; j++) sel.cols.push_back(j);
        sel.row_ptr[r + 1] = int64_t(sel.cols.size());
      }
  }
  return all_causal_stats(cu_seqlens, ndocs, s);
}

GatingStats all_causal_stats(const int32_t* cu_seqlens, int ndocs, AttnShape s) {
  GatingStats st;
  for (int d = 0; d < ndocs; d++) {
    const double nb = cpu::num_blocks(cu_seqlens[d + 1] - cu_seqlens[d], s.block_size);
    st.rows += s.n_kv_heads * nb;
    st.kept_blocks += s.n_kv_heads * nb * (nb + 1) / 2;
  }
  st.causal_blocks = st.kept_blocks;
  st.recall_sum = st.rows;
  return st;
}

template GatingStats gate_blocks<float>(const float*, const float*, const int32_t*, int, AttnShape, GatingParams,
                                        BlockSelection&);
template GatingStats gate_blocks<double>(const double*, const double*, const int32_t*, int, AttnShape,
                                         GatingParams, BlockSelection&);
template void pool_block_keys<float>(const float*, int, int, int, AttnShape, GatingParams, double*);
template void pool_block_keys<double>(const double*, int, int, int, AttnShape, GatingParams, double*);
template void gate_token_scores<float>(const float*, const double*, int, int, int, AttnShape, GatingParams, float*);
template void gate_token_scores<double>(const double*, const double*, int, int, int, AttnShape, GatingParams, float*);
template GatingStats gate_blocks_pooled<float>(const float*, const double*, int, AttnShape, GatingParams,
                                               BlockSelection&, const char*);
template GatingStats gate_blocks_pooled<double>(const double*, const double*, int, AttnShape, GatingParams,
                                                BlockSelection&, const char*);

}  // namespace sb::kernels
