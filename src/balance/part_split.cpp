#include "src/balance/part_split.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "base/error.hpp"

namespace sb {

std::vector<double> block_costs(int64_t len, int block_size, bool sparse, int k, int local_blocks,
                                double token_cost, double dense_share) {
  const int64_t nb = (len + block_size - 1) / block_size;
  std::vector<double> c(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    const double tokens = double(std::min<int64_t>(block_size, len - i * block_size));
    const double sk = double(std::min<int64_t>(i + 1, int64_t(k) + local_blocks + 2));
    const double kept = sparse ? (dense_share > 0 ? (1 - dense_share) * sk + dense_share * double(i + 1) : sk) : double(i + 1);
    c[size_t(i)] = token_cost * tokens + kept;
  }
  return c;
}

double token_cost(const LatencyModel& lm) {
  const double bs = lm.shape().block_size;
  const double per_token = lm.part_ms(Part::Linear, 1) - lm.part_ms(Part::Linear, 0);  // whole model
  const double attn_token = lm.part_ms(Part::Attention, 1) - lm.part_ms(Part::Attention, 0);
  const double pair = lm.part_ms(Part::Attention, 0, bs * bs) - lm.part_ms(Part::Attention, 0);
  return pair > 0 ? (per_token / lm.shape().n_layers + attn_token) / pair : 0.0;
}

std::vector<std::vector<Piece>> split_document(int64_t len, int G, int block_size, std::span<const double> costs) {
  const int64_t nb = (len + block_size - 1) / block_size;
  if (G < 1 || int64_t(costs.size()) != nb)
    throw Error("split_document: " + std::to_string(costs.size()) + " block costs for a document of " +
                std::to_string(nb) + " blocks over " + std::to_string(G) + " ranks");
  std::vector<double> prefix(size_t(nb) + 1, 0.0);  // prefix[j]: work of blocks [0, j)
  std::partial_sum(costs.begin(), costs.end(), prefix.begin() + 1);
  const int chunks = 2 * G;
  // Chunk c is blocks [cut[c], cut[c+1]), cut at the block boundaries nearest to c/chunks of `p`'s total.
  auto cuts = [&](const std::vector<double>& p) {
    std::vector<int64_t> cut(size_t(chunks) + 1, nb);
    cut[0] = 0;
    for (int c = 1; c < chunks; ++c) {
      const double goal = p.back() * c / chunks;
      int64_t j = std::lower_bound(p.begin(), p.end(), goal) - p.begin();
      if (j > 0 && goal - p[size_t(j - 1)] <= p[size_t(j)] - goal) j -= 1;
      cut[size_t(c)] = std::max(cut[size_t(c - 1)], std::min(j, nb));
    }
    return cut;
  };
  auto max_work = [&](const std::vector<int64_t>& cut) {  // the busiest member's work
    double hi = 0;
    for (int r = 0; r < G; ++r) {
      const size_t a = size_t(r), b = size_t(chunks - 1 - r);
      hi = std::max(hi, prefix[size_t(cut[a + 1])] - prefix[size_t(cut[a])] + prefix[size_t(cut[b + 1])] -
                            prefix[size_t(cut[b])]);
    }
    return hi;
  };
  // Equal work per chunk, or Megatron's zigzag (equal blocks per chunk), whichever leaves the busiest
  // member less: equal-work chunks win for sparse rows (their cost stops growing at the budget); for
  // dense rows zigzag's pairs cancel the linear growth exactly, where equal-work chunks round to
  // whole blocks (up to ~1% at 8 members of a 128K document).
  std::vector<double> blocks(size_t(nb) + 1);
  std::iota(blocks.begin(), blocks.end(), 0.0);
  std::vector<int64_t> cut = cuts(prefix);
  if (const std::vector<int64_t> zz = cuts(blocks); max_work(zz) < max_work(cut)) cut = zz;
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

MicroBatch piece_batch(uint64_t doc, std::span<const Piece> pieces) {
  MicroBatch mb;
  for (auto [b, e] : pieces) mb.segs.push_back({doc, uint64_t(b), uint64_t(e - b)}), mb.tokens += e - b;
  return mb;
}

}  // namespace sb
