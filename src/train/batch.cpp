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
  return gb;
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
