#include "src/balance/dst.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "base/error.hpp"
#include "base/named.hpp"

namespace sb {

constexpr Named<Target> kTargets[] = {
    {Target::Mean, "mean"}, {Target::Min, "min"}, {Target::Max, "max"}, {Target::Recall, "recall"}};
constexpr Named<Tuning> kTunings[] = {{Tuning::Fixed, "fixed"}, {Tuning::Dst, "dst"}};

Target parse_target(const std::string& s) { return parse_named(kTargets, s, "balance.target"); }
Tuning parse_tuning(const std::string& s) { return parse_named(kTunings, s, "balance.tuning"); }
const char* target_name(Target t) { return name_of(kTargets, t); }
const char* tuning_name(Tuning t) { return name_of(kTunings, t); }

std::vector<int> budget_steps(const DstParams& p, int* k0_index) {
  int lo = std::max(p.k_min, int(std::floor(p.k0 * (1 - p.max_change))));
  int hi = std::min(p.k_max, int(std::ceil(p.k0 * (1 + p.max_change))));
  lo = std::max(0, std::min(lo, p.k0)), hi = std::max(hi, p.k0);  // k0 is always allowed
  std::vector<int> ks;
  for (int k = lo; k <= hi; ++k) ks.push_back(k);
  if (k0_index) *k0_index = p.k0 - lo;
  return ks;
}

namespace {

// Recall x tokens of the query rows of piece [b, e) of a sequence (b on the block grid), layer l,
// budget k: block rows [b/Bs, ceil(e/Bs)) of the sequence, the same rows whatever its length.
double piece_recall_tokens(const RecallModel& rm, int l, int64_t b, int64_t e, int k) {
  const int64_t bs = rm.shape().block_size, r0 = b / bs, r1 = (e + bs - 1) / bs;
  auto rows = [&](int64_t n) { return n > 0 ? rm.recall(l, n * bs, k) * double(n) : 0.0; };  // sum over rows < n
  return r1 > r0 ? (rows(r1) - rows(r0)) * double(e - b) / double(r1 - r0) : 0.0;
}

}  // namespace

DstItems build_items(std::span<const MicroBatch> mbs, const LatencyModel& lm, const RecallModel& rm, const DstParams& p,
                     std::span<const int64_t> doc_len, std::span<const double> fixed_extra_ms) {
  if (lm.shape().n_layers != p.n_layers || rm.n_layers() != p.n_layers)
    throw Error("dst: n_layers differs between the latency model (" + std::to_string(lm.shape().n_layers) +
                "), the recall model (" + std::to_string(rm.n_layers()) + ") and the tuning parameters (" +
                std::to_string(p.n_layers) + ")");
  if (!doc_len.empty() && doc_len.size() != mbs.size())
    throw std::logic_error("dst: build_items got " + std::to_string(doc_len.size()) + " document lengths for " +
                           std::to_string(mbs.size()) + " micro-batches");
  if (!fixed_extra_ms.empty() && fixed_extra_ms.size() != mbs.size())
    throw std::logic_error("dst: build_items got " + std::to_string(fixed_extra_ms.size()) + " extra times for " +
                           std::to_string(mbs.size()) + " micro-batches");
  DstItems it;
  it.ks = budget_steps(p, &it.i0);
  it.n_mb = int(mbs.size()), it.n_layers = p.n_layers, it.n_steps = int(it.ks.size());
  const int S = it.n_steps, L = it.n_layers;
  const auto& sh = lm.shape();
  double bs2 = double(sh.block_size) * sh.block_size;
  it.fixed_ms.assign(size_t(it.n_mb), 0), it.attn_ms.assign(size_t(it.n_mb * S), 0);
  it.rec.assign(size_t(it.n_mb) * L * S, 0), it.weight.assign(size_t(it.n_mb), 0);
  it.dense = lm.dense_layers();
  const int n_dense = L - it.n_tuned();
  std::vector<double> kept(static_cast<size_t>(S));
  for (int m = 0; m < it.n_mb; ++m) {
    const auto& mb = mbs[size_t(m)];
    const int64_t whole = doc_len.empty() ? 0 : doc_len[size_t(m)];  // > 0: a split document's part
    double tokens = double(mb.tokens), pairs = 0, causal = 0;  // causal: the rows' causal blocks (dense layers)
    std::fill(kept.begin(), kept.end(), 0.0);
    double* rec = &it.rec[size_t(m) * L * S];
    for (const auto& s : mb.segs) {
      // The rows [b, e) of a sequence of n tokens: a whole segment is [0, len) of itself.
      const int64_t b = whole ? int64_t(s.begin) : 0, e = b + int64_t(s.len), n = whole ? whole : e;
      const int64_t nb = (e + sh.block_size - 1) / sh.block_size;
      if (!whole) pairs += LatencyModel::causal_blocks(n, sh.block_size);
      causal += LatencyModel::causal_blocks(b, e, sh.block_size);
      for (int j = 0; j < S; ++j) kept[size_t(j)] += lm.kept_blocks(e, it.ks[size_t(j)]) - (b ? lm.kept_blocks(b, it.ks[size_t(j)]) : 0.0);
      if (nb <= sh.local_blocks + 2 + it.ks[0]) {  // dense at every allowed budget: recall 1
        for (int x = 0; x < L * S; ++x) rec[x] += double(e - b);
        continue;
      }
      for (int l = 0; l < L; ++l)
        for (int j = 0; j < S; ++j)
          rec[l * S + j] += !it.tuned(l) ? double(e - b)  // a dense layer keeps it all
                            : whole ? piece_recall_tokens(rm, l, b, e, it.ks[size_t(j)])
                                    : rm.recall_tokens(l, n, it.ks[size_t(j)]);
    }
    // A part's gating: its rows' or the whole document's, as the engine gates it (part_gating_ms);
    // dense layers do not gate, and their attention is fixed.
    const double gating = whole ? lm.part_gating_ms(mb, whole) : lm.sparse_layers() * lm.part_ms(Part::Gating, tokens, pairs);
    const double dense_ms = n_dense > 0 ? n_dense * lm.part_ms(Part::Attention, tokens, causal * bs2) : 0.0;
    it.fixed_ms[size_t(m)] = lm.part_ms(Part::Linear, tokens) + gating + dense_ms +
                             (fixed_extra_ms.empty() ? 0.0 : fixed_extra_ms[size_t(m)]);
    for (int j = 0; j < S; ++j) it.attn_ms[size_t(m * S + j)] = lm.part_ms(Part::Attention, tokens, kept[size_t(j)] * bs2);
    it.weight[size_t(m)] = tokens * L;
  }
  return it;
}

double item_ms(const DstItems& it, int m, std::span<const int> k_per_layer) {
  if (m < 0 || m >= it.n_mb || int(k_per_layer.size()) != it.n_layers)
    throw std::logic_error("dst: item_ms of micro-batch " + std::to_string(m) + " of " + std::to_string(it.n_mb) +
                           " with " + std::to_string(k_per_layer.size()) + " budgets for " + std::to_string(it.n_layers) + " layers");
  double ms = it.fixed_ms[size_t(m)];
  for (int l = 0; l < it.n_layers; ++l) {
    if (!it.tuned(l)) continue;  // a dense layer: in fixed_ms
    const int k = k_per_layer[size_t(l)], j = k - it.ks.front();
    if (j < 0 || j >= it.n_steps) throw std::logic_error("dst: item_ms: budget " + std::to_string(k) + " is not allowed");
    ms += it.attn_ms[size_t(m * it.n_steps + j)];
  }
  return ms;
}

}  // namespace sb
