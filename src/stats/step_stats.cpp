#include "src/stats/step_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace sb {

static constexpr size_t kRankDoubles = sizeof(RankStats) / sizeof(double);
static constexpr size_t kLayerDoubles = sizeof(LayerStats) / sizeof(double);
static_assert(std::is_trivially_copyable_v<RankStats> && sizeof(RankStats) == 28 * sizeof(double));
static_assert(std::is_trivially_copyable_v<LayerStats> && sizeof(LayerStats) == 6 * sizeof(double));

RankStats& RankStats::operator+=(const RankStats& o) {
  double a[kRankDoubles], b[kRankDoubles];
  std::memcpy(a, this, sizeof a);
  std::memcpy(b, &o, sizeof b);
  for (size_t i = 0; i < kRankDoubles; ++i) a[i] += b[i];
  std::memcpy(this, a, sizeof a);
  return *this;
}

StepStats::StepStats(int n_ranks, int n_layers) : ranks(size_t(n_ranks), RankStats{}), layers(size_t(n_layers), LayerStats{}) {}

void StepStats::allreduce(const Comm& comm) {
  const size_t nr = ranks.size() * kRankDoubles, nl = layers.size() * kLayerDoubles;
  wire_.resize(nr + 2 + nl);
  double* w = wire_.data();
  std::memcpy(w, ranks.data(), nr * sizeof(double));
  w[nr] = loss_sum, w[nr + 1] = correct;
  std::memcpy(w + nr + 2, layers.data(), nl * sizeof(double));
  comm.allreduce_sum_inplace(wire_);
  std::memcpy(ranks.data(), w, nr * sizeof(double));
  loss_sum = w[nr], correct = w[nr + 1];
  std::memcpy(layers.data(), w + nr + 2, nl * sizeof(double));
}

RankStats StepStats::sum() const {
  RankStats s{};
  for (const RankStats& r : ranks) s += r;
  return s;
}

void StepStats::add_micro_batch(int me, const MicroBatch& mb, int64_t tokens, const AttnSettings& a,
                                const MicroBatchStats& ms, const PartTimes& pred, const LatencyModel& lm, int k0,
                                const ModelDims& dims) {
  const int n_kv_heads = dims.n_kv_heads;
  RankStats& my = ranks[size_t(me)];
  my.flops += train_flops(dims, tokens, ms.gating, a.block_size);
  my.pred_attn += pred.attention, my.pred_gating += pred.gating, my.pred_linear += pred.linear;
  my.attn_ms += ms.attn_ms, my.gating_ms += ms.gating_ms;
  loss_sum += ms.loss_sum, correct += double(ms.correct);
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& g = ms.gating[l];
    const int k = a.k[l];
    my.budget_sum += k, my.budget_n += 1;
    my.budget_min = std::min(my.budget_min, double(k)), my.budget_max = std::max(my.budget_max, double(k));
    my.above += k > k0, my.below += k < k0;
    my.kept += g.kept_blocks, my.causal += g.causal_blocks, my.recall_sum += g.recall_sum, my.rows += g.rows;
    LayerStats& ls = layers[l];
    ls.kept += g.kept_blocks, ls.causal += g.causal_blocks, ls.recall_sum += g.recall_sum, ls.rows += g.rows;
    my.true_recall_sum += g.true_recall_sum, my.true_rows += g.true_rows;
    ls.true_recall_sum += g.true_recall_sum, ls.true_rows += g.true_rows;
    if (a.sparse_at(int(l))) {  // what the budget allowed vs what survived theta (per kv head)
      double anchors = 0, allowed = 0;
      for (const auto& sg : mb.segs) {
        anchors += lm.anchor_blocks(int64_t(sg.len));
        allowed += (lm.kept_blocks(int64_t(sg.len), k) - lm.anchor_blocks(int64_t(sg.len))) / lm.density();
      }
      my.cand_pred += allowed, my.cand_meas += g.kept_blocks / n_kv_heads - anchors;
    }
  }
}

std::vector<RankRow> StepStats::rank_rows(int64_t step) const {
  std::vector<RankRow> out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankStats& x = ranks[r];
    RankRow rr{};
    rr.step = step, rr.rank = int32_t(r), rr.micro_batches = int32_t(x.micro_batches), rr.tokens = int64_t(x.tokens);
    rr.compute_ms = x.compute_ms, rr.idle_ms = x.idle_ms, rr.predicted_ms = x.predicted_ms;
    rr.mean_budget = x.budget_n > 0 ? x.budget_sum / x.budget_n : 0;
    rr.min_budget = x.budget_min, rr.max_budget = x.budget_max;
    rr.density = x.causal > 0 ? x.kept / x.causal : 1;
    rr.recall = x.rows > 0 ? x.recall_sum / x.rows : 1;
    out.push_back(rr);
  }
  return out;
}

void StepStats::fill(StepRow& row, int64_t tokens, double peak_flops) const {
  const int R = int(ranks.size());
  const RankStats s = sum();
  double max_compute = 0, max_step = 0, pred_err = 0;
  for (const RankStats& x : ranks) {
    max_compute = std::max(max_compute, x.compute_ms);
    max_step = std::max(max_step, x.step_ms);
    if (x.compute_ms > 0) pred_err += std::abs(x.predicted_ms - x.compute_ms) / x.compute_ms / R;
  }
  row.makespan_ms = max_step;
  row.tokens_per_s = max_step > 0 ? double(tokens) / (max_step / 1000.0) : 0;
  row.imbalance = s.compute_ms > 0 ? max_compute / (s.compute_ms / R) : 1;
  row.bubble = max_step > 0 ? s.idle_ms / (R * max_step) : 0;
  row.density = s.causal > 0 ? s.kept / s.causal : 1;
  row.recall = s.rows > 0 ? s.recall_sum / s.rows : 1;
  row.recall_true = s.true_rows > 0 ? s.true_recall_sum / s.true_rows : -1;
  row.pred_error = pred_err;
  row.mfu = peak_flops > 0 && max_step > 0 ? s.flops / (max_step / 1000.0) / (R * peak_flops) : 0;
  row.peak_mem_gib = 0;
  for (const RankStats& x : ranks) row.peak_mem_gib = std::max(row.peak_mem_gib, x.mem_peak / double(1ull << 30));
}

}  // namespace sb
