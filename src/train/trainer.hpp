// The training loop: every step on every rank runs plan, predict, exchange, tune, compute,
// reduce, update, measure, record (DESIGN.md, "The step").
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "io/metrics_log.hpp"
#include "io/shard.hpp"
#include "src/balance/dst_exchange.hpp"
#include "src/balance/latency_model.hpp"
#include "src/balance/plan.hpp"
#include "src/comm/comm.hpp"
#include "src/config/config.hpp"
#include "src/train/settings.hpp"
#include "src/model/model.hpp"
#include "src/train/batch.hpp"
#include "src/engine/engine.hpp"
#include "src/train/faults.hpp"
#include "src/train/resume.hpp"
#include "src/parts/groups.hpp"
#include "src/stats/summary.hpp"
#include "src/engine/update.hpp"

namespace sb {

// Set from a signal handler (SIGUSR1/SIGTERM): checkpoint at the end of this step and exit.
extern std::atomic<int> g_stop_signal;

class Trainer {
 public:
  // resume: "" (fresh), "latest" (newest in checkpoint.dir, fresh if none), or a checkpoint path.
  // stop_at > 0: stop after that step (writing a checkpoint), as a preempted job would.
  // weights_given: set_initial_weights follows (--init-from), so no random base is drawn.
  Trainer(const Config& cfg, const Comm& comm, const std::string& resume, int64_t stop_at, bool weights_given = false);
  TrainResult run();
  // train --init-from: these weights (in the model's layout) replace the initial ones before run(),
  // with the optimizer state fresh. Ignored, returning false, when the trainer resumed from a checkpoint.
  // With LoRA on (lora.rank > 0) the weights are the frozen base (base_layout() order), applied
  // also after a resume (a checkpoint holds no base: run() checks it is the checkpoint's); `source`
  // names them (the --init-from path).
  bool set_initial_weights(std::vector<float> w, const std::string& source = "");
  // LoRA, train --init-from ADAPTER_DIR: the trainable tensors (layout() order) for a fresh run;
  // ignored, returning false, when resumed.
  bool set_initial_adapters(std::vector<float> w);
  const Model<float>& model() const { return model_; }
  const std::string& base_xxh64() const { return base_xxh64_; }  // LoRA: the frozen base's XXH64 (16 hex digits)
  const Settings& settings() const { return set_; }  // as built from the config, once
  // The budgets this rank gave its rows of documents in parts so far (data.long_docs = "split"; DST
  // tunes them as it does whole micro-batches): lowest, highest, and how many (part, layer) items.
  struct PartBudgets {
    int lo = 1 << 30, hi = -1;
    int64_t items = 0;
  };
  const PartBudgets& part_budgets() const { return part_budgets_; }

 private:
  struct StepOut;
  struct StepState;  // what one step carries from phase to phase
  StepOut step(int64_t s);
  // The phases of step(), in order (DESIGN.md, "The step").
  void plan(StepState& st);
  void predict(StepState& st);
  void exchange(StepState& st);
  void tune(StepState& st);
  void compute(StepState& st);
  void reduce(StepState& st);
  void update(StepState& st);
  void measure(StepState& st);
  StepOut record(StepState& st);
  void save_checkpoint(int64_t s);
  // Resume (src/train/resume.cpp): true when a checkpoint was applied.
  bool restore(const std::string& resume);
  Restored read_resume(const std::string& path);
  void apply_checkpoint(Restored&& r);

  Config cfg_;  // stored in checkpoints
  const Comm& comm_;
  Dataset ds_;
  Settings set_;
  ModelDims dims_;  // set_.model
  Model<float> model_;  // with LoRA: the base frozen, weights() the adapters and train_also parts
  AdamW opt_;
  LatencyModel lm_;
  RecallModel rm_;
  DstExchange dst_work_;  // this rank's items, the receive buffer, every rank's summaries: kept across steps
  std::unique_ptr<Engine> engine_;  // compute, reduce, update on train.device
  Faults faults_;                   // train.inject_error_* (testing aid)
  DataCursor cur_;                 // data.path
  std::vector<uint64_t> order_;
  std::vector<double> weights_;    // data.sources, normalised (empty: data.path)
  MixCursor mix_;
  std::vector<std::vector<uint64_t>> mix_orders_;
  std::unique_ptr<MetricsLog> log_;
  PartGroups part_groups_{comm_};  // this step's split documents' groups (data.long_docs = "split")
  PartBudgets part_budgets_;
  int64_t start_step_ = 0, stop_at_ = 0, skipped_ = 0;
  std::string last_checkpoint_;
  // LoRA: this run's base (where from, XXH64 of its fp32 weights as 16 hex digits) and, when
  // resumed, the checkpoint's (run() refuses a mismatch, naming both).
  std::string base_, base_xxh64_, ck_base_, ck_base_xxh64_;
  void hash_base();
  std::string archive_;  // a branch's archive of the abandoned run (resume.hpp), "" otherwise
};

}  // namespace sb
