#include "src/train/batch.hpp"

#include <algorithm>
#include <random>

#include "base/error.hpp"

namespace sb {

std::vector<uint64_t> epoch_order(const Dataset& ds, uint64_t seed, double val_fraction, int64_t epoch) {
  std::vector<uint64_t> order = ds.train_docs(seed, val_fraction);
  if (order.empty()) throw Error(ds.path() + ": no training documents (data.val_fraction leaves none)");
  if (epoch > 0) {  // Fisher-Yates with our own index draw: reproducible across standard libraries
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng() % (i + 1)]);
  }
  return order;
}

GlobalBatch draw_global_batch(const Dataset& ds, uint64_t seed, double val_fraction, int64_t tokens, DataCursor& cur,
                              std::vector<uint64_t>& order) {
  if (order.empty()) order = epoch_order(ds, seed, val_fraction, cur.epoch);
  GlobalBatch gb;
  while (gb.tokens < tokens) {
    if (cur.index >= int64_t(order.size())) {
      cur.epoch += 1, cur.index = 0;
      order = epoch_order(ds, seed, val_fraction, cur.epoch);
    }
    uint64_t doc = order[size_t(cur.index++)];
    uint64_t len = ds.doc_length(doc);
    if (len == 0) continue;
    gb.docs.emplace_back(doc, len);
    gb.tokens += int64_t(len);
  }
  gb.source_docs.assign(ds.num_sources(), 0), gb.source_tokens.assign(ds.num_sources(), 0);
  for (auto [doc, len] : gb.docs) {
    const size_t s = ds.source_of(doc);
    gb.source_docs[s] += 1, gb.source_tokens[s] += int64_t(len);
  }
  return gb;
}

size_t pick_source(const std::vector<double>& weights, uint64_t seed, int64_t n) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t(n) + 1);  // splitmix64: one 64-bit draw from (seed, n)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = double(z >> 11) * 0x1p-53;
  double cum = 0;
  for (size_t i = 0; i + 1 < weights.size(); ++i)
    if (u < (cum += weights[i])) return i;
  return weights.size() - 1;  // the last takes what rounding leaves
}

std::vector<uint64_t> source_epoch_order(const Dataset& ds, size_t src, uint64_t seed, double val_fraction, int64_t epoch) {
  std::vector<uint64_t> order = ds.source_train_docs(src, seed, val_fraction);
  const std::string key = "data.sources[" + std::to_string(src) + "].path = " + ds.source_path(src);
  if (order.empty()) throw Error(key + ": no training documents (data.val_fraction leaves none)");
  if (std::none_of(order.begin(), order.end(), [&](uint64_t d) { return ds.doc_length(d) > 0; }))
    throw Error(key + ": every training document is empty; expected documents with tokens");
  if (epoch > 0) {  // as epoch_order; source 0 shuffles as one dataset does, the others their own way
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch) + (uint64_t(src) << 40));
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng() % (i + 1)]);
  }
  return order;
}

GlobalBatch draw_mixture_batch(const Dataset& ds, const std::vector<double>& weights, uint64_t seed, double val_fraction,
                               int64_t tokens, MixCursor& cur, std::vector<std::vector<uint64_t>>& orders) {
  const size_t ns = weights.size();
  if (ns != ds.num_sources()) throw std::logic_error("draw_mixture_batch: weights and sources differ in number");
  cur.epochs.resize(ns, 0), cur.indexes.resize(ns, 0);
  orders.resize(ns);
  GlobalBatch gb;
  gb.source_docs.assign(ns, 0), gb.source_tokens.assign(ns, 0);
  while (gb.tokens < tokens) {
    const size_t s = pick_source(weights, seed, cur.draws++);
    if (orders[s].empty()) orders[s] = source_epoch_order(ds, s, seed, val_fraction, cur.epochs[s]);
    if (cur.indexes[s] >= int64_t(orders[s].size())) {  // this source ran out: its next epoch
      cur.epochs[s] += 1, cur.indexes[s] = 0;
      orders[s] = source_epoch_order(ds, s, seed, val_fraction, cur.epochs[s]);
    }
    const uint64_t doc = orders[s][size_t(cur.indexes[s]++)], len = ds.doc_length(doc);
    if (len == 0) continue;
    gb.docs.emplace_back(doc, len);
    gb.tokens += int64_t(len);
    gb.source_docs[s] += 1, gb.source_tokens[s] += int64_t(len);
  }
  return gb;
}

Dataset open_data(const DataSettings& d) {
  if (d.sources.empty()) return Dataset::open(d.path);
  std::vector<std::string> paths;
  for (const auto& s : d.sources) paths.push_back(s.path);
  return Dataset::open_sources(paths);
}

int64_t count_targets(const Dataset& ds, const std::vector<Segment>& segs) {
  int64_t n = 0;
  for (const auto& s : segs) {
    if (s.len < 2) continue;
    if (!ds.has_masks()) {
      n += int64_t(s.len) - 1;
      continue;
    }
    std::vector<uint8_t> mask = ds.read_mask(s.doc, s.begin, s.len);
    for (size_t i = 1; i < mask.size(); ++i) n += mask[i];
  }
  return n;
}

std::vector<uint32_t> read_segment(const Dataset& ds, const Segment& s) {
  auto [shard, local] = ds.locate(s.doc);
  return ds.shards()[shard].read_window(local, s.begin, s.len);  // ids checked: a bad one names shard and document
}

PackedBatch pack_micro_batch(const Dataset& ds, const MicroBatch& mb) {
  PackedBatch b;
  b.cu_seqlens.push_back(0);
  for (const auto& s : mb.segs) {
    const size_t at = b.tokens.size();
    b.add(read_segment(ds, s));
    mask_targets(ds, s, b, at);
  }
  return b;
}

PackedBatch pack_part(const Dataset& ds, const MicroBatch& mb, const DocPart& sh) {
  PackedBatch b;
  b.cu_seqlens.push_back(0);  // no whole sequences
  for (const auto& s : mb.segs) {
    const size_t at = b.tokens.size();
    // The piece and the token after it (the last row's target), unless the document ends here.
    const Segment with_next{s.doc, s.begin, std::min<uint64_t>(s.len + 1, uint64_t(sh.doc_len) - s.begin)};
    b.add_rows(read_segment(ds, with_next), int32_t(s.begin), size_t(s.len));
    mask_targets(ds, with_next, b, at);
  }
  b.parts.push_back(sh);
  return b;
}

void mask_targets(const Dataset& ds, const Segment& s, PackedBatch& b, size_t at) {
  if (!ds.has_masks() || s.len < 2) return;
  std::vector<uint8_t> mask = ds.read_mask(s.doc, s.begin, s.len);
  for (size_t i = 0; i + 1 < mask.size(); ++i)  // position i predicts token i+1
    if (!mask[i + 1]) b.targets[at + i] = -1;
}

}  // namespace sb
