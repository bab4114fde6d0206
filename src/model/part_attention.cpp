// Attention of a split document (context parallelism, DocPart in model.hpp).
//
// Each rank runs the ordinary kernels over the whole document with every query row it does not own
// emptied from the selection, so its work is its own rows' kept blocks only. Sparse gating scores
// only its own query blocks (gate_blocks_pooled's query_blocks) against every block's pooled key, so
// a member's gating is its share of the document's, and each row's choice is one rank's. K and V reach it one of two ways (PartExchangeMode, attention.part_exchange):
// - all-gather of K and V within the group (in the backward a reduce-scatter of dK and dV back to
//   the keys' owners): simple, (G - 1) * L rows per tensor per member;
// - selective: the pooled block keys (nb x Hkv*D, small) are gathered first, so gating picks
//   exactly one rank's blocks; then each member fetches only the rows of the blocks its own rows
//   keep from their owners (alltoallv), and the backward sends those blocks' dK, dV back to the
//   owners, who add them. Auto takes it when it moves below kAutoShare of the all-gather.
// The CUDA path (part_attention_cuda.cpp) all-gathers on device buffers (NCCL, or MPI through host
// memory when ranks share a GPU: src/parts/groups_cuda.hpp).
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "src/model/part_attention.hpp"

namespace sb {

namespace k = kernels;

int64_t PartNeeds::rows(int m) const {
  int64_t n = 0;
  for (auto [b, e] : need[size_t(m)]) n += e - b;
  return n;
}

int32_t DocPart::local_tokens() const {
  int32_t n = 0;
  for (auto [b, e] : pieces) n += e - b;
  return n;
}

void check_part_pieces(const DocPart& sh, int block_size) {
  int32_t prev = 0;
  for (auto [b, e] : sh.pieces) {
    if (b < prev || e < b || e > sh.doc_len || b % block_size != 0 || (e % block_size != 0 && e != sh.doc_len))
      throw std::logic_error("DocPart: piece [" + std::to_string(b) + ", " + std::to_string(e) +
                             ") of a document of " + std::to_string(sh.doc_len) +
                             " tokens is out of order or off the block grid (block_size " +
                             std::to_string(block_size) + ")");
    prev = e;
  }
}

k::GatingStats keep_own_rows(const DocPart& sh, k::AttnShape s, k::BlockSelection& sel) {
  const int nb = (sh.doc_len + s.block_size - 1) / s.block_size;
  std::vector<char> mine(size_t(nb), 0);
  for (auto [b, e] : sh.pieces)
    for (int i = b / s.block_size; i * s.block_size < e; ++i) mine[size_t(i)] = 1;
  k::BlockSelection out;
  out.doc_row_base = sel.doc_row_base;
  out.row_ptr.assign(sel.row_ptr.size(), 0);
  out.recall.assign(sel.recall.size(), 0.0f);
  k::GatingStats st;
  for (int64_t r = 0; r + 1 < int64_t(sel.row_ptr.size()); ++r) {
    const int i = int(r % nb);
    if (mine[size_t(i)]) {
      out.cols.insert(out.cols.end(), sel.cols.begin() + sel.row_ptr[r], sel.cols.begin() + sel.row_ptr[r + 1]);
      out.recall[size_t(r)] = sel.recall[size_t(r)];
      st.rows += 1;
      st.kept_blocks += double(sel.row_ptr[r + 1] - sel.row_ptr[r]);
      st.causal_blocks += i + 1;
      st.recall_sum += sel.recall[size_t(r)];
    }
    out.row_ptr[size_t(r) + 1] = int64_t(out.cols.size());
  }
  sel = std::move(out);
  return st;
}

namespace {

// The document position of each of this rank's rows; the pieces checked against the block grid.
std::vector<int32_t> owned_rows(const DocPart& sh, int block_size) {
  check_part_pieces(sh, block_size);
  std::vector<int32_t> rows;
  for (auto [b, e] : sh.pieces)
    for (int32_t t = b; t < e; ++t) rows.push_back(t);
  return rows;
}

// whole[rows[i]] = mine[i] (rows of `width`); the other rows of `whole` are zero.
template <class T>
std::vector<T> scatter_rows(const T* mine, const std::vector<int32_t>& rows, int32_t len, int width) {
  std::vector<T> whole(size_t(len) * width, T(0));
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(mine + i * width, mine + (i + 1) * width, whole.begin() + size_t(rows[i]) * width);
  return whole;
}

template <class T>
void gather_rows(const std::vector<T>& whole, const std::vector<int32_t>& rows, int width, T* mine) {
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(whole.begin() + size_t(rows[i]) * width, whole.begin() + size_t(rows[i] + 1) * width, mine + i * width);
}

template <class T>
std::vector<T> gather_whole(const DocPart& sh, const PartExchange<T>& ex, const T* mine, int width) {
  std::vector<T> whole(size_t(sh.doc_len) * width);
  ex.gather(sh, std::span<const T>(mine, size_t(sh.local_tokens()) * width), whole, width);
  return whole;
}


// ---- The selective exchange (PartExchangeMode::Selective / Auto)

// The blocks this rank owns (every block of a piece: pieces start on the grid, so a block is one
// member's whole), flags over the document's nb blocks.
std::vector<char> owned_blocks(const DocPart& sh, int bs, int nb) {
  std::vector<char> mine(size_t(nb), 0);
  for (auto [b, e] : sh.pieces)
    for (int i = b / bs; i * bs < e; ++i) mine[size_t(i)] = 1;
  return mine;
}

}  // namespace

std::vector<std::pair<int32_t, int32_t>> needed_ranges(const DocPart& sh, const k::BlockSelection& sel, int bs) {
  const int nb = (sh.doc_len + bs - 1) / bs;
  const std::vector<char> mine = owned_blocks(sh, bs, nb);
  std::vector<char> need(size_t(nb), 0);
  for (int32_t j : sel.cols) need[size_t(j)] = !mine[size_t(j)];
  std::vector<std::pair<int32_t, int32_t>> out;
  for (int j = 0; j < nb; ++j) {
    if (!need[size_t(j)]) continue;
    const int32_t b = j * bs, e = std::min(sh.doc_len, (j + 1) * bs);
    if (!out.empty() && out.back().second == b) out.back().second = e;
    else out.push_back({b, e});
  }
  return out;
}

namespace {

// Gating of this rank's query blocks from every block's key summary (gathered: nb x Hkv*R*D doubles,
// R = key_summary_rows: 1 for the mean), so each of its rows keeps exactly the blocks one rank
// holding the document would keep; the other rows are empty. Q (L, H*D) is zero outside this rank's
// rows; k is this rank's packed rows.
template <class T>
k::GatingStats gate_shared(const DocPart& sh, const PartExchange<T>& ex, const T* Q, const T* kk, k::AttnShape s,
                           k::GatingParams p, k::BlockSelection& sel) {
  const int KD = s.n_kv_heads * s.head_dim, bs = s.block_size, L = sh.doc_len;
  const int W = k::key_summary_rows(p, bs) * KD;  // summary doubles per block
  std::vector<double> mine, whole(size_t((L + bs - 1) / bs) * W);  // (blocks, Hkv*R*D)
  int32_t at = 0;  // packed row of the piece's start
  for (auto [b, e] : sh.pieces) {
    const int b0 = b / bs, b1 = (e + bs - 1) / bs;
    const size_t off = mine.size();
    mine.resize(off + size_t(b1 - b0) * W);
    k::pool_block_keys(kk + size_t(at) * KD, L, b0, b1, s, p, mine.data() + off);
    at += e - b;
  }
  ex.gather_blocks(sh, mine, whole, W, bs);
  return k::gate_blocks_pooled(Q, whole.data(), L, s, p, sel, owned_blocks(sh, bs, (L + bs - 1) / bs).data());
}

// The same from the whole document's keys K (L, Hkv*D, all-gathered): every block pooled here.
template <class T>
k::GatingStats gate_own(const DocPart& sh, const T* Q, const T* K, k::AttnShape s, k::GatingParams p,
                        k::BlockSelection& sel) {
  const int bs = s.block_size, L = sh.doc_len, nb = (L + bs - 1) / bs;
  std::vector<double> kbar(size_t(nb) * s.n_kv_heads * k::key_summary_rows(p, bs) * s.head_dim);  // (blocks, Hkv*R*D)
  k::pool_block_keys(K, L, 0, nb, s, p, kbar.data());
  return k::gate_blocks_pooled(Q, kbar.data(), L, s, p, sel, owned_blocks(sh, bs, nb).data());
}

// Whole-document K and V (L, Hkv*D): this rank's rows plus what `sel`'s kept rows need (selective),
// or every member's rows (all-gather). Returns the needs when the exchange was selective.
template <class T>
std::optional<PartNeeds> whole_kv(const DocPart& sh, const PartExchange<T>& ex, const T* kk, const T* v,
                                   const std::vector<int32_t>& rows, k::AttnShape s, const k::BlockSelection& sel,
                                   std::vector<T>& K, std::vector<T>& V) {
  const int KD = s.n_kv_heads * s.head_dim, L = sh.doc_len;
  std::optional<PartNeeds> needs;
  if (ex.mode != PartExchangeMode::AllGather) {
    needs = ex.share_needs(sh, needed_ranges(sh, sel, s.block_size));
    if (ex.mode == PartExchangeMode::Auto && double(needs->selective_rows) >= kAutoShare * double(needs->allgather_rows))
      needs.reset();
  }
  if (!needs) {
    K = gather_whole(sh, ex, kk, KD), V = gather_whole(sh, ex, v, KD);
    return needs;
  }
  K = scatter_rows(kk, rows, L, KD), V = scatter_rows(v, rows, L, KD);
  const size_t n = rows.size();
  std::vector<T> kv(n * 2 * KD), got(size_t(needs->rows(needs->member)) * 2 * KD);  // (rows, [K | V])
  for (size_t i = 0; i < n; ++i) {
    std::copy_n(kk + i * KD, KD, kv.begin() + i * 2 * KD);
    std::copy_n(v + i * KD, KD, kv.begin() + i * 2 * KD + KD);
  }
  ex.fetch(sh, *needs, kv, got, 2 * KD);
  size_t at = 0;  // got's rows, in need order
  for (auto [b, e] : needs->need[size_t(needs->member)])
    for (int32_t t = b; t < e; ++t, at += 2 * KD) {
      std::copy_n(got.begin() + at, KD, K.begin() + size_t(t) * KD);
      std::copy_n(got.begin() + at + KD, KD, V.begin() + size_t(t) * KD);
    }
  return needs;
}

}  // namespace

template <class T>
k::GatingStats part_attention_fwd(const DocPart& sh, const PartExchange<T>& ex, const T* q, const T* kk,
                                   const T* v, k::AttnShape s, bool sparse, k::GatingParams p,
                                   k::BlockSelection& sel, T* att, T* lse) {
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim, L = sh.doc_len;
  const std::vector<int32_t> rows = owned_rows(sh, s.block_size);
  const std::vector<T> Q = scatter_rows(q, rows, L, HD);  // (L, HD), zero outside this rank's rows
  const int32_t cu[2] = {0, L};
  std::vector<T> K, V;  // (L, KD)
  // Row i's choice needs its own pooled queries (here) and every block's pooled keys: from the
  // gathered K, or (selective) shared on their own. Only this rank's rows are gated.
  if (ex.mode == PartExchangeMode::AllGather) K = gather_whole(sh, ex, kk, KD), V = gather_whole(sh, ex, v, KD);
  k::GatingStats st;
  if (!sparse) {
    k::select_all_causal(cu, 1, s, sel);
    st = keep_own_rows(sh, s, sel);
  } else if (ex.mode == PartExchangeMode::AllGather) {
    st = gate_own(sh, Q.data(), K.data(), s, p, sel);
  } else {
    st = gate_shared(sh, ex, Q.data(), kk, s, p, sel);
  }
  if (ex.mode != PartExchangeMode::AllGather) whole_kv(sh, ex, kk, v, rows, s, sel, K, V);
  std::vector<T> O(size_t(L) * HD), S(size_t(L) * s.n_heads);  // (L, HD), (L, H)
  k::block_attention_fwd(Q.data(), K.data(), V.data(), cu, 1, s, sel, O.data(), S.data());
  gather_rows(O, rows, HD, att);
  gather_rows(S, rows, s.n_heads, lse);
  return st;
}

template <class T>
void part_attention_bwd(const DocPart& sh, const PartExchange<T>& ex, const T* q, const T* kk, const T* v,
                         const T* att, const T* lse, const T* datt, k::AttnShape s, const k::BlockSelection& sel,
                         T* dq, T* dk, T* dv) {
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim, L = sh.doc_len;
  const std::vector<int32_t> rows = owned_rows(sh, s.block_size);
  const std::vector<T> Q = scatter_rows(q, rows, L, HD), O = scatter_rows(att, rows, L, HD),
                       dO = scatter_rows(datt, rows, L, HD), S = scatter_rows(lse, rows, L, s.n_heads);
  std::vector<T> K, V;
  const std::optional<PartNeeds> needs = whole_kv(sh, ex, kk, v, rows, s, sel, K, V);
  const int32_t cu[2] = {0, L};
  std::vector<T> dQ(size_t(L) * HD), dK(size_t(L) * KD), dV(size_t(L) * KD);
  k::block_attention_bwd(Q.data(), K.data(), V.data(), O.data(), S.data(), dO.data(), cu, 1, s, sel, dQ.data(),
                         dK.data(), dV.data());
  gather_rows(dQ, rows, HD, dq);
  const size_t n = size_t(sh.local_tokens()) * KD;
  if (!needs) {
    ex.reduce_scatter(sh, dK, std::span<T>(dk, n), KD);  // every member's contribution to the keys it owns
    ex.reduce_scatter(sh, dV, std::span<T>(dv, n), KD);
    return;
  }
  // Selective: this rank's own contribution, plus the others' for its rows (give_back adds them).
  std::vector<T> mine(rows.size() * 2 * KD), got;  // (rows, [dK | dV])
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(dK.begin() + size_t(rows[i]) * KD, KD, mine.begin() + i * 2 * KD);
    std::copy_n(dV.begin() + size_t(rows[i]) * KD, KD, mine.begin() + i * 2 * KD + KD);
  }
  for (auto [b, e] : needs->need[size_t(needs->member)])
    for (int32_t t = b; t < e; ++t) {
      got.insert(got.end(), dK.begin() + size_t(t) * KD, dK.begin() + size_t(t + 1) * KD);
      got.insert(got.end(), dV.begin() + size_t(t) * KD, dV.begin() + size_t(t + 1) * KD);
    }
  ex.give_back(sh, *needs, got, mine, 2 * KD);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(mine.begin() + i * 2 * KD, KD, dk + i * KD);
    std::copy_n(mine.begin() + i * 2 * KD + KD, KD, dv + i * KD);
  }
}

template k::GatingStats part_attention_fwd<float>(const DocPart&, const PartExchange<float>&, const float*,
                                                   const float*, const float*, k::AttnShape, bool, k::GatingParams,
                                                   k::BlockSelection&, float*, float*);
template k::GatingStats part_attention_fwd<double>(const DocPart&, const PartExchange<double>&, const double*,
                                                    const double*, const double*, k::AttnShape, bool,
                                                    k::GatingParams, k::BlockSelection&, double*, double*);
template void part_attention_bwd<float>(const DocPart&, const PartExchange<float>&, const float*, const float*,
                                         const float*, const float*, const float*, const float*, k::AttnShape,
                                         const k::BlockSelection&, float*, float*, float*);
template void part_attention_bwd<double>(const DocPart&, const PartExchange<double>&, const double*,
                                          const double*, const double*, const double*, const double*,
                                          const double*, k::AttnShape, const k::BlockSelection&, double*, double*,
                                          double*);

}  // namespace sb
