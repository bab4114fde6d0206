#include "src/balance/dst.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

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

DstItems build_items(std::span<const MicroBatch> mbs, const LatencyModel& lm, const RecallModel& rm, const DstParams& p) {
  if (lm.shape().n_layers != p.n_layers || rm.n_layers() != p.n_layers)
    throw Error("dst: n_layers differs between the latency model (" + std::to_string(lm.shape().n_layers) +
                "), the recall model (" + std::to_string(rm.n_layers()) + ") and the tuning parameters (" +
                std::to_string(p.n_layers) + ")");
  DstItems it;
  it.ks = budget_steps(p, &it.i0);
  it.n_mb = int(mbs.size()), it.n_layers = p.n_layers, it.n_steps = int(it.ks.size());
  const int S = it.n_steps, L = it.n_layers;
  const auto& sh = lm.shape();
  double bs2 = double(sh.block_size) * sh.block_size;
  it.fixed_ms.assign(size_t(it.n_mb), 0), it.attn_ms.assign(size_t(it.n_mb * S), 0);
  it.rec.assign(size_t(it.n_mb) * L * S, 0), it.weight.assign(size_t(it.n_mb), 0);
  std::vector<double> kept(static_cast<size_t>(S));
  for (int m = 0; m < it.n_mb; ++m) {
    const auto& mb = mbs[size_t(m)];
    double tokens = double(mb.tokens), pairs = 0;
    std::fill(kept.begin(), kept.end(), 0.0);
    double* rec = &it.rec[size_t(m) * L * S];
    for (const auto& s : mb.segs) {
      int64_t len = int64_t(s.len), nb = (len + sh.block_size - 1) / sh.block_size;
      pairs += LatencyModel::causal_blocks(len, sh.block_size);
      for (int j = 0; j < S; ++j) kept[size_t(j)] += lm.kept_blocks(len, it.ks[size_t(j)]);
      if (nb <= sh.local_blocks + 2 + it.ks[0]) {  // dense at every allowed budget: recall 1
        for (int x = 0; x < L * S; ++x) rec[x] += double(len);
        continue;
      }
      for (int l = 0; l < L; ++l)
        for (int j = 0; j < S; ++j) rec[l * S + j] += rm.recall_tokens(l, len, it.ks[size_t(j)]);
    }
    it.fixed_ms[size_t(m)] = lm.part_ms(Part::Linear, tokens) + L * lm.part_ms(Part::Gating, tokens, pairs);
    for (int j = 0; j < S; ++j) it.attn_ms[size_t(m * S + j)] = lm.part_ms(Part::Attention, tokens, kept[size_t(j)] * bs2);
    it.weight[size_t(m)] = tokens * L;
  }
  return it;
}

}  // namespace sb
