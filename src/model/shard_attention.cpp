// Attention of a sharded document (context parallelism, DocShard in model.hpp).
//
// The exchange is an all-gather of K and V within the group (and, in the backward, a reduce-scatter
// of dK and dV back to the keys' owners): exact and simple, and on the group sizes a document of a
// few micro-batches needs (2 to 8 ranks) it moves G * L * Hkv*D values per tensor, the same order as
// a ring of point-to-point steps. Each rank then runs the ordinary kernels over the whole document
// with every query row it does not own emptied from the selection, so its work is its own rows'
// kept blocks only, and the kernels need no change. The CUDA path (shard_attention_cuda.cpp) does the
// same on device buffers, staging the exchange through host memory.
#include <stdexcept>
#include <string>

#include "src/model/shard_attention.hpp"

namespace sb {

namespace k = kernels;

int32_t DocShard::local_tokens() const {
  int32_t n = 0;
  for (auto [b, e] : pieces) n += e - b;
  return n;
}

void check_shard_pieces(const DocShard& sh, int block_size) {
  int32_t prev = 0;
  for (auto [b, e] : sh.pieces) {
    if (b < prev || e < b || e > sh.doc_len || b % block_size != 0 || (e % block_size != 0 && e != sh.doc_len))
      throw std::logic_error("DocShard: piece [" + std::to_string(b) + ", " + std::to_string(e) +
                             ") of a document of " + std::to_string(sh.doc_len) +
                             " tokens is out of order or off the block grid (block_size " +
                             std::to_string(block_size) + ")");
    prev = e;
  }
}

k::GatingStats keep_own_rows(const DocShard& sh, k::AttnShape s, k::BlockSelection& sel) {
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
std::vector<int32_t> owned_rows(const DocShard& sh, int block_size) {
  check_shard_pieces(sh, block_size);
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
std::vector<T> gather_whole(const DocShard& sh, const ShardExchange<T>& ex, const T* mine, int width) {
  std::vector<T> whole(size_t(sh.doc_len) * width);
  ex.gather(sh, std::span<const T>(mine, size_t(sh.local_tokens()) * width), whole, width);
  return whole;
}

}  // namespace

template <class T>
k::GatingStats shard_attention_fwd(const DocShard& sh, const ShardExchange<T>& ex, const T* q, const T* kk,
                                   const T* v, k::AttnShape s, bool sparse, k::GatingParams p,
                                   k::BlockSelection& sel, T* att, T* lse) {
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim, L = sh.doc_len;
  const std::vector<int32_t> rows = owned_rows(sh, s.block_size);
  const std::vector<T> Q = scatter_rows(q, rows, L, HD);  // (L, HD), zero outside this rank's rows
  const std::vector<T> K = gather_whole(sh, ex, kk, KD), V = gather_whole(sh, ex, v, KD);  // (L, KD)
  const int32_t cu[2] = {0, L};
  // Row i's choice needs its own pooled queries (here) and every block's pooled keys (in K).
  if (sparse) k::gate_blocks(Q.data(), K.data(), cu, 1, s, p, sel);
  else k::select_all_causal(cu, 1, s, sel);
  const k::GatingStats st = keep_own_rows(sh, s, sel);
  std::vector<T> O(size_t(L) * HD), S(size_t(L) * s.n_heads);  // (L, HD), (L, H)
  k::block_attention_fwd(Q.data(), K.data(), V.data(), cu, 1, s, sel, O.data(), S.data());
  gather_rows(O, rows, HD, att);
  gather_rows(S, rows, s.n_heads, lse);
  return st;
}

template <class T>
void shard_attention_bwd(const DocShard& sh, const ShardExchange<T>& ex, const T* q, const T* kk, const T* v,
                         const T* att, const T* lse, const T* datt, k::AttnShape s, const k::BlockSelection& sel,
                         T* dq, T* dk, T* dv) {
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim, L = sh.doc_len;
  const std::vector<int32_t> rows = owned_rows(sh, s.block_size);
  const std::vector<T> Q = scatter_rows(q, rows, L, HD), O = scatter_rows(att, rows, L, HD),
                       dO = scatter_rows(datt, rows, L, HD), S = scatter_rows(lse, rows, L, s.n_heads);
  const std::vector<T> K = gather_whole(sh, ex, kk, KD), V = gather_whole(sh, ex, v, KD);
  const int32_t cu[2] = {0, L};
  std::vector<T> dQ(size_t(L) * HD), dK(size_t(L) * KD), dV(size_t(L) * KD);
  k::block_attention_bwd(Q.data(), K.data(), V.data(), O.data(), S.data(), dO.data(), cu, 1, s, sel, dQ.data(),
                         dK.data(), dV.data());
  gather_rows(dQ, rows, HD, dq);
  const size_t n = size_t(sh.local_tokens()) * KD;
  ex.reduce_scatter(sh, dK, std::span<T>(dk, n), KD);  // every member's contribution to the keys it owns
  ex.reduce_scatter(sh, dV, std::span<T>(dv, n), KD);
}

template k::GatingStats shard_attention_fwd<float>(const DocShard&, const ShardExchange<float>&, const float*,
                                                   const float*, const float*, k::AttnShape, bool, k::GatingParams,
                                                   k::BlockSelection&, float*, float*);
template k::GatingStats shard_attention_fwd<double>(const DocShard&, const ShardExchange<double>&, const double*,
                                                    const double*, const double*, k::AttnShape, bool,
                                                    k::GatingParams, k::BlockSelection&, double*, double*);
template void shard_attention_bwd<float>(const DocShard&, const ShardExchange<float>&, const float*, const float*,
                                         const float*, const float*, const float*, const float*, k::AttnShape,
                                         const k::BlockSelection&, float*, float*, float*);
template void shard_attention_bwd<double>(const DocShard&, const ShardExchange<double>&, const double*,
                                          const double*, const double*, const double*, const double*,
                                          const double*, k::AttnShape, const k::BlockSelection&, double*, double*,
                                          double*);

}  // namespace sb
