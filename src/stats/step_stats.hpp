// What a step measured, typed: each rank fills its own RankStats and the sums it contributes to;
// one all-reduce of the whole (as a span of doubles) gives every rank every rank's measurements,
// so every rank updates its latency and recall models identically.
#pragma once
#include <cstdint>
#include <vector>

#include "io/metrics_log.hpp"
#include "src/balance/latency_model.hpp"
#include "src/balance/segment.hpp"
#include "src/comm/comm.hpp"
#include "src/model/model.hpp"

namespace sb {

// One rank's step. Doubles only: the all-reduce sums them as they are (other ranks' copies are 0).
struct RankStats {
  double compute_ms, idle_ms, predicted_ms, micro_batches, tokens;
  double budget_sum, budget_n, budget_min, budget_max;  // over (micro-batch, layer) items
  double kept, causal, recall_sum, rows;                // gating: kept / causal blocks, recall x rows
  double attn_ms, gating_ms;                            // measured
  double pred_attn, pred_gating, pred_linear;           // predicted at the tuned budgets
  double cand_pred, cand_meas;                          // blocks the budget allowed vs that survived theta
  double above, below;                                  // items tuned above / below k0
  double step_ms, stop;                                 // stop: 1 when this rank was asked to stop
  double flops, mem_peak;                               // model FLOPs (train_flops), device memory high-water (bytes)
  double true_recall_sum, true_rows;                    // true recall of the sampled rows (balance.recall_rows)
  RankStats& operator+=(const RankStats& o);
};

// One layer's gating, summed over ranks and micro-batches.
struct LayerStats {
  double kept, causal, recall_sum, rows;
  double true_recall_sum, true_rows;  // sampled rows' true recall (balance.recall_rows)
};

struct StepStats {
  std::vector<RankStats> ranks;    // [rank]
  double loss_sum = 0, correct = 0;  // summed over ranks
  std::vector<LayerStats> layers;  // [layer]
  StepStats(int n_ranks, int n_layers);
  // compute: one micro-batch of rank `me` (`tokens` tokens), run at a.k (k0: the default budget),
  // with what the latency model predicted for it.
  void add_micro_batch(int me, const MicroBatch& mb, int64_t tokens, const AttnSettings& a, const MicroBatchStats& ms,
                       const PartTimes& pred, const LatencyModel& lm, int k0, const ModelDims& dims);
  // In place, one collective. The wire layout (ranks, loss_sum, correct, layers) is fixed, so each
  // sum is formed in the same order whatever else changes.
  void allreduce(const Comm& comm);
  RankStats sum() const;  // over ranks, in rank order
  // record (after the all-reduce): every rank's row, and the step row's timing and gating fields
  // (makespan, tokens/s, imbalance, bubble, density, recall, prediction error, mfu against
  // `peak_flops` per rank in FLOP/s (0: unknown, mfu 0), peak memory).
  std::vector<RankRow> rank_rows(int64_t step) const;
  void fill(StepRow& row, int64_t tokens, double peak_flops = 0) const;

 private:
  std::vector<double> wire_;
};

}  // namespace sb
