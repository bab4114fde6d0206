// The HDF5 metrics log: two (data.sources: three) extendible, chunked tables of compound rows,
//   /steps    (steps)           one row per optimizer step
//   /ranks    (steps, ranks)    one row per step and rank
//   /sources  (steps, sources)  data.sources only: one row per step and source (a third table, so
//                               readers of the first two see no change)
// written by rank 0 in SWMR mode and flushed every few steps, so h5py can read it while the
// run goes on (h5py.File(path, 'r', libver='latest', swmr=True)).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/h5.hpp"

namespace sb {

struct StepRow {
  int64_t step;          // 1-based optimizer step
  double loss;           // mean next-token loss over the global batch
  double grad_norm;      // global gradient norm before clipping
  double lr;
  int64_t tokens;        // tokens in the global batch
  double makespan_ms;    // slowest rank's step time (compute + reduce + update)
  double tokens_per_s;
  double imbalance;      // max / mean of the ranks' compute time
  double bubble;         // idle / (ranks * makespan)
  double density;        // mean kept-block density over ranks
  double recall;         // mean recall over ranks
  double plan_ms;        // plan + predict + exchange + tune on rank 0
  double pred_error;     // mean |predicted - measured| / measured over ranks' compute
  int32_t skipped;       // 1 when the step was skipped for a non-finite loss/gradient
  double mfu;            // model FLOPs / (makespan * ranks * peak FLOP/s); 0 when no peak is known
  double peak_mem_gib;   // largest device memory high-water over ranks (GiB; 0 on the CPU)
  double recall_true;    // true recall of the sampled rows (balance.recall_rows); -1 when not measured
};

struct RankRow {
  int64_t step;
  int32_t rank;
  int32_t micro_batches;
  int64_t tokens;
  double compute_ms;     // forward + backward of this rank's micro-batches
  double idle_ms;        // waiting for the slowest rank before the all-reduce
  double predicted_ms;   // latency model's prediction of compute_ms (after tuning)
  double mean_budget;    // mean k over micro-batches x layers
  double min_budget, max_budget;
  double density;        // kept / causal blocks
  double recall;         // mean row recall
};

struct SourceRow {       // what the step's global batch drew from one source of data.sources
  int64_t step;
  int32_t source;        // index into data.sources
  int64_t docs, tokens;
};

class MetricsLog {
 public:
  // Create a new log, or (resume) open an existing one and drop rows after `resume_step`.
  // sources: data.sources' count (0: data.path, no /sources table).
  MetricsLog(const std::string& path, int ranks, bool resume, int64_t resume_step, int sources = 0);
  void append(const StepRow& step, std::span<const RankRow> ranks, std::span<const SourceRow> sources = {});
  void flush();
  const std::string& path() const { return path_; }
  int64_t rows() const { return rows_; }

 private:
  void append_rows(const StepRow& step, std::span<const RankRow> ranks, std::span<const SourceRow> sources);
  std::string path_;
  int ranks_, sources_;
  int64_t rows_ = 0;
  h5::Id file_, steps_, ranks_ds_, sources_ds_, step_type_, rank_type_, source_type_;
};

// The log of a run: new, or (resume) continued after `resume_step`. A log left "open for write"
// by a killed job (kill -9, node loss) is cleared as h5clear does and reopened; one that still
// cannot be continued (torn, or written by another rank count) is moved aside to a name never used
// before (PATH.before_step<N>, then .2, .3, ...) with a warning, and a new one is started.
// archive_copy (a resume from an older checkpoint): first copy the log as it was to that path, so
// the rows of the abandoned steps are kept there, not dropped. A fresh run (resume false) that
// finds a log at `path` moves it to archive_copy (the earlier run's archived checkpoints) or, with
// none or on another file system, to PATH.earlier (.2, .3, ...), printing where: an earlier run's
// log is never replaced. inputs: files the run reads (its
// shards), which the log must never replace. Errors name the path and log.path.
std::unique_ptr<MetricsLog> open_metrics_log(const std::string& path, int ranks, bool resume, int64_t resume_step,
                                             const std::string& archive_copy = "",
                                             std::span<const std::string> inputs = {}, int sources = 0);

// Read back (for inspect and tests).
struct MetricsTables {
  std::vector<StepRow> steps;
  std::vector<RankRow> ranks;  // steps x ranks, row-major
  int n_ranks = 0;
  std::vector<SourceRow> sources;  // steps x n_sources, row-major (none without /sources)
  int n_sources = 0;
};
MetricsTables read_metrics(const std::string& path);

}  // namespace sb
