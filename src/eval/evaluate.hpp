// eval: validation loss by document-length bucket and accuracy on the synthetic tasks' answer
// spans, with dense and with sparse attention, over the validation split.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "io/shard.hpp"
#include "src/comm/comm.hpp"
#include "src/engine/engine.hpp"
#include "src/model/model.hpp"
#include "src/train/settings.hpp"

namespace sb {

struct EvalPart {
  double loss_sum = 0;
  int64_t targets = 0;
  std::vector<double> bucket_loss;      // per bucket: summed loss
  std::vector<int64_t> bucket_targets;  // per bucket: targets
  std::array<int64_t, 4> task_correct{}, task_total{};  // by task type (0 unused)
  std::vector<std::array<int64_t, 4>> bucket_task_correct, bucket_task_total;  // [bucket][task type]
  // span_accuracy (data with loss masks): records whose every trained target in the window is the
  // greedy prediction (teacher-forced), over records with at least one trained target there.
  int64_t span_correct = 0, span_total = 0;
  std::vector<int64_t> bucket_span_correct, bucket_span_total;  // per bucket
  std::vector<double> source_loss;      // per source of the dataset (data.sources; one for data.path): summed loss
  std::vector<int64_t> source_targets;  // per source: targets
  double loss() const { return targets ? loss_sum / double(targets) : 0; }
};

struct EvalResult {
  std::vector<int64_t> bucket_bounds;  // upper bounds (inclusive) of length buckets; last = no bound
  EvalPart dense, sparse;
  // With loss masks (Dataset::has_masks): the dense loss over the trained targets only.
  bool masked = false;
  double masked_loss_sum = 0;
  int64_t masked_targets = 0;
  double masked_loss() const { return masked_targets ? masked_loss_sum / double(masked_targets) : 0; }
  int64_t docs = 0, tokens = 0;
  std::vector<uint64_t> doc_ids;  // the validation documents evaluated, in order
  std::vector<int64_t> source_docs;  // per source: documents evaluated (val_docs takes the sources in turn)
};

// Evaluates eval.docs validation documents, spread over ranks (results identical on all ranks).
// A document longer than train.micro_batch_tokens is evaluated on its last window (where the
// task's question and answer sit). Runs on the engine's device (train.device) with its weights.
EvalResult evaluate(const Settings& s, const Comm& comm, Engine& engine, const Dataset& ds);

}  // namespace sb
