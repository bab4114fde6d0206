#include "src/stats/summary.hpp"

#include <algorithm>
#include <cstdio>

namespace sb {

RunSummary::RunSummary(const std::string& log_path, int64_t first_step) {
  res_.log = log_path;
  res_.first_step = first_step;
}

void RunSummary::add(const StepRow& row, int64_t above, int64_t below) {
  if (n_ == 0) res_.first_loss = row.loss;
  res_.last_loss = row.loss;
  res_.losses.push_back(row.loss);
  res_.step_ms.push_back(row.makespan_ms);
  res_.last_step = row.step;
  ++n_;
  sum_tokens_ += double(row.tokens), sum_ms_ += row.makespan_ms;
  sum_mfu_ms_ += row.mfu * row.makespan_ms;  // mfu over the run = its FLOPs / its time / peak
  res_.peak_mem_gib = std::max(res_.peak_mem_gib, row.peak_mem_gib);
  res_.mean_imbalance += row.imbalance, res_.mean_bubble += row.bubble;
  res_.mean_density += row.density, res_.mean_recall += row.recall, res_.mean_pred_error += row.pred_error;
  res_.budgets_above_k0 += above, res_.budgets_below_k0 += below;
  if (row.recall_true >= 0) true_sum_ += row.recall_true, true_n_ += 1;
}

void RunSummary::add_sources(std::span<const SourceRow> rows) {
  res_.source_docs.resize(rows.size(), 0), res_.source_tokens.resize(rows.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i) res_.source_docs[i] += rows[i].docs, res_.source_tokens[i] += rows[i].tokens;
}

TrainResult RunSummary::finish(const std::string& last_checkpoint, bool stopped_early) {
  if (n_ > 0) {
    res_.tokens_per_s = sum_ms_ > 0 ? sum_tokens_ / (sum_ms_ / 1000.0) : 0;
    res_.mean_step_ms = sum_ms_ / double(n_);
    res_.mfu = sum_ms_ > 0 ? sum_mfu_ms_ / sum_ms_ : 0;
    for (double* x : {&res_.mean_imbalance, &res_.mean_bubble, &res_.mean_density, &res_.mean_recall, &res_.mean_pred_error})
      *x /= double(n_);
  }
  res_.mean_recall_true = true_n_ > 0 ? true_sum_ / double(true_n_) : -1;
  res_.checkpoint = last_checkpoint;
  res_.stopped_early = stopped_early;
  return res_;
}

void print_progress(const StepRow& row, int64_t total_steps) {
  std::printf("step %5lld/%lld | loss %.4f | gnorm %.3f | lr %.2e | %7.1f ms | %8.0f tok/s | imb %.2f | dens %.2f | rec %.3f",
              static_cast<long long>(row.step), static_cast<long long>(total_steps), row.loss, row.grad_norm, row.lr,
              row.makespan_ms, row.tokens_per_s, row.imbalance, row.density, row.recall);
  if (row.recall_true >= 0) std::printf(" | true rec %.3f", row.recall_true);  // balance.recall_rows
  if (row.mfu > 0) std::printf(" | mfu %.1f%%", 100 * row.mfu);  // only when a peak is known
  if (row.peak_mem_gib > 0) std::printf(" | mem %.1f GiB", row.peak_mem_gib);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace sb
