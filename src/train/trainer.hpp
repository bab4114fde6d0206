// The training loop: every step on every rank runs plan, predict, exchange, tune, compute,
// reduce, update, measure, record (DESIGN.md, "The step").
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "io/metrics_log.hpp"
#include "io/shard.hpp"
#include "src/balance/dst.hpp"
#include "src/balance/latency_model.hpp"
#include "src/balance/plan.hpp"
#include "src/comm/comm.hpp"
#include "src/config/config.hpp"
#include "src/model/model.hpp"
#include "src/train/engine.hpp"
#include "src/train/faults.hpp"
#include "src/train/plan_batch.hpp"
#include "src/train/resume.hpp"
#include "src/train/update.hpp"

namespace sb {

// Set from a signal handler (SIGUSR1/SIGTERM): checkpoint at the end of this step and exit.
extern std::atomic<int> g_stop_signal;

struct TrainResult {
  int64_t first_step = 0, last_step = 0;  // steps run in this process (1-based, inclusive)
  double first_loss = 0, last_loss = 0;
  double tokens_per_s = 0, mean_imbalance = 0, mean_bubble = 0, mean_density = 0, mean_recall = 0;
  double mean_step_ms = 0, mean_pred_error = 0;
  int64_t budgets_above_k0 = 0, budgets_below_k0 = 0;  // (micro-batch x layer) items moved by DST, all ranks
  std::string checkpoint, log;
  bool stopped_early = false;  // by --stop-at or a signal
  std::vector<double> losses;
  std::vector<double> step_ms;  // makespan of every step (the first ones include warm-up)
};

class Trainer {
 public:
  // resume: "" (fresh), "latest" (newest in checkpoint.dir, fresh if none), or a checkpoint path.
  // stop_at > 0: stop after that step (writing a checkpoint), as a preempted job would.
  Trainer(const Config& cfg, const Comm& comm, const std::string& resume, int64_t stop_at);
  TrainResult run();
  const Model<float>& model() const { return model_; }

 private:
  struct StepOut;
  StepOut step(int64_t s);
  void save_checkpoint(int64_t s);
  // Resume (src/train/resume.cpp): true when a checkpoint was applied.
  bool restore(const std::string& resume);
  Restored read_resume(const std::string& path);
  void apply_checkpoint(Restored&& r);

  Config cfg_;
  const Comm& comm_;
  Dataset ds_;
  ModelDims dims_;
  Model<float> model_;
  OptimSettings os_;
  AdamW opt_;
  LatencyModel lm_;
  RecallModel rm_;
  DstParams dst_;
  DstExchange dst_work_;  // the exchange's buffers, kept across steps
  Batching batching_;
  PlanOptions plan_opt_;
  AttnSettings attn_;
  std::unique_ptr<Engine> engine_;  // compute, reduce, update on train.device
  Faults faults_;                   // train.inject_error_* (testing aid)
  DataCursor cur_;
  std::vector<uint64_t> order_;
  std::unique_ptr<MetricsLog> log_;
  int64_t start_step_ = 0, stop_at_ = 0, skipped_ = 0;
  std::string last_checkpoint_;
  std::string archive_;  // a branch's archive of the abandoned run (resume.hpp), "" otherwise
};

}  // namespace sb
