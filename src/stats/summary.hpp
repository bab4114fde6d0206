// The run summary: what `train` reports when it ends, accumulated step by step from the rows the
// step records (the same rows the metrics log gets).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/metrics_log.hpp"

namespace sb {

struct TrainResult {
  int64_t first_step = 0, last_step = 0;  // steps run in this process (1-based, inclusive)
  double first_loss = 0, last_loss = 0;
  double tokens_per_s = 0, mean_imbalance = 0, mean_bubble = 0, mean_density = 0, mean_recall = 0;
  double mean_step_ms = 0, mean_pred_error = 0;
  double mean_recall_true = -1;  // over the steps that sampled true recall (balance.recall_rows); -1: none
  double mfu = 0;           // model FLOPs over the run's time and peak (0 when no peak is known)
  double peak_mem_gib = 0;  // largest device memory high-water of any rank and step (0 on the CPU)
  int64_t budgets_above_k0 = 0, budgets_below_k0 = 0;  // (micro-batch x layer) items moved by DST, all ranks
  std::string checkpoint, log;
  bool stopped_early = false;  // by --stop-at or a signal
  std::vector<double> losses;
  std::vector<double> step_ms;  // makespan of every step (the first ones include warm-up)
  // data.sources: documents and tokens drawn from each source over the steps run (empty for data.path).
  std::vector<int64_t> source_docs, source_tokens;
};

class RunSummary {
 public:
  RunSummary(const std::string& log_path, int64_t first_step);
  // One step's row; above / below: items tuned above / below k0 over all ranks.
  void add(const StepRow& row, int64_t above, int64_t below);
  // One step's draws per source (data.sources).
  void add_sources(std::span<const SourceRow> rows);
  // The means over the steps added.
  TrainResult finish(const std::string& last_checkpoint, bool stopped_early);

 private:
  TrainResult res_;
  double sum_tokens_ = 0, sum_ms_ = 0, sum_mfu_ms_ = 0, true_sum_ = 0;  // true_sum_: recall_true over true_n_ steps
  int64_t true_n_ = 0;
  int64_t n_ = 0;
};

// The progress line rank 0 prints per step (log.progress).
void print_progress(const StepRow& row, int64_t total_steps);

}  // namespace sb
