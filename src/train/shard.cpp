#include "src/train/shard.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.hpp"

namespace sb {

std::vector<double> block_costs(int64_t len, int block_size, bool sparse, int k, int local_blocks,
                                double token_cost) {
  const int64_t nb = (len + block_size - 1) / block_size;
  std::vector<double> c(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    const double tokens = double(std::min<int64_t>(block_size, len - i * block_size));
    const double kept = sparse ? double(std::min<int64_t>(i + 1, int64_t(k) + local_blocks + 2)) : double(i + 1);
    c[size_t(i)] = token_cost * tokens + kept;
  }
  return c;
}

double token_cost(const ModelDims& d, int block_size) {
  const double C = d.d_model, HD = double(d.n_heads) * d.head_dim, KD = double(d.n_kv_heads) * d.head_dim;
  const double linear = 2 * (C * HD + 2 * C * KD + HD * C + 3 * C * d.ffn_dim);  // per token and layer
  return linear / (4.0 * block_size * block_size * HD);                           // QK^T and PV of one block pair
}

std::vector<std::vector<Piece>> split_document(int64_t len, int G, int block_size, std::span<const double> costs) {
  const int64_t nb = (len + block_size - 1) / block_size;
  if (G < 1 || int64_t(costs.size()) != nb)
    throw Error("split_document: " + std::to_string(costs.size()) + " block costs for a document of " +
                std::to_string(nb) + " blocks over " + std::to_string(G) + " ranks");
  std::vector<double> prefix(size_t(nb) + 1, 0.0);  // prefix[j]: work of blocks [0, j)
  std::partial_sum(costs.begin(), costs.end(), prefix.begin() + 1);
  const int chunks = 2 * G;
  std::vector<int64_t> cut(size_t(chunks) + 1, nb);  // chunk c is blocks [cut[c], cut[c+1])
  cut[0] = 0;
  for (int c = 1; c < chunks; ++c) {  // the block boundary nearest to c/chunks of the work
    const double goal = prefix.back() * c / chunks;
    int64_t j = std::lower_bound(prefix.begin(), prefix.end(), goal) - prefix.begin();
    if (j > 0 && goal - prefix[size_t(j - 1)] <= prefix[size_t(j)] - goal) j -= 1;
    cut[size_t(c)] = std::max(cut[size_t(c - 1)], std::min(j, nb));
  }
  auto tokens = [&](int c) {
    return Piece{int32_t(cut[size_t(c)] * block_size), int32_t(std::min<int64_t>(cut[size_t(c) + 1] * block_size, len))};
  };
  std::vector<std::vector<Piece>> out(static_cast<size_t>(G));
  for (int r = 0; r < G; ++r) {
    Piece a = tokens(r), b = tokens(chunks - 1 - r);
    if (a.second == b.first) a.second = b.second, b = {b.second, b.second};  // the middle member: one piece
    for (Piece p : {a, b})
      if (p.second > p.first) out[size_t(r)].push_back(p);
  }
  return out;
}

std::optional<DocShard> ShardGroups::add(int first, int32_t doc_len, std::vector<std::vector<Piece>> pieces) {
  const int me = world_.rank(), G = int(pieces.size());
  if (first < 0 || first + G > world_.size())
    throw Error("a document sharded over ranks [" + std::to_string(first) + ", " + std::to_string(first + G) +
                ") needs " + std::to_string(first + G) + " ranks; the run has " + std::to_string(world_.size()));
  const bool member = me >= first && me < first + G;
  auto e = std::make_unique<Entry>(Entry{Group(world_, member ? first : -1, me), std::move(pieces), doc_len});
  DocShard sh;
  sh.group = int(groups_.size());
  sh.doc_len = doc_len;
  if (member) sh.pieces = e->pieces[size_t(me - first)];
  groups_.push_back(std::move(e));
  if (!member) return std::nullopt;
  return sh;
}

template <class T>
void ShardGroups::gather(const DocShard& sh, std::span<const T> mine, std::span<T> whole, int width) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  std::vector<int> counts;
  for (const auto& ps : e.pieces) {
    int64_t n = 0;
    for (auto [b, x] : ps) n += x - b;
    counts.push_back(int(n * width));
  }
  std::vector<T> by_member(whole.size());
  e.comm.allgatherv(mine, std::span<T>(by_member), counts);
  size_t at = 0;  // member order -> document order
  for (const auto& ps : e.pieces)
    for (auto [b, x] : ps) {
      const size_t n = size_t(x - b) * width;
      std::copy_n(by_member.begin() + at, n, whole.begin() + size_t(b) * width);
      at += n;
    }
}

template <class T>
void ShardGroups::reduce_scatter(const DocShard& sh, std::span<const T> whole, std::span<T> mine, int width) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  std::vector<int> counts;
  std::vector<T> by_member;  // document order -> member order
  by_member.reserve(whole.size());
  for (const auto& ps : e.pieces) {
    const size_t before = by_member.size();
    for (auto [b, x] : ps)
      by_member.insert(by_member.end(), whole.begin() + size_t(b) * width, whole.begin() + size_t(x) * width);
    counts.push_back(int(by_member.size() - before));
  }
  e.comm.reduce_scatter(std::span<const T>(by_member), mine, counts);
}

template <class T>
ShardExchange<T> ShardGroups::bind() const {
  ShardExchange<T> ex;
  ex.gather = [this](const DocShard& sh, std::span<const T> mine, std::span<T> whole, int width) {
    gather(sh, mine, whole, width);
  };
  ex.reduce_scatter = [this](const DocShard& sh, std::span<const T> whole, std::span<T> mine, int width) {
    reduce_scatter(sh, whole, mine, width);
  };
  return ex;
}

// After bind's definition, which it instantiates.
ShardGroups::ShardGroups(const Comm& world) : world_(world), ex32_(bind<float>()), ex64_(bind<double>()) {}

}  // namespace sb
