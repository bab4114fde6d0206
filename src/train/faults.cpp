#include "src/train/faults.hpp"

#include "base/error.hpp"

namespace sb {

static constexpr Faults::Phase kPhases[] = {
    Faults::Phase::Plan,    Faults::Phase::Predict, Faults::Phase::Exchange, Faults::Phase::Tune,
    Faults::Phase::Compute, Faults::Phase::Reduce,  Faults::Phase::Update,   Faults::Phase::Measure,
    Faults::Phase::Record,  Faults::Phase::Checkpoint};

const char* Faults::name(Phase p) {
  static const char* names[] = {"plan",   "predict", "exchange", "tune",   "compute",
                                "reduce", "update",  "measure",  "record", "checkpoint"};
  return names[int(p)];
}

Faults::Faults(const TrainSettings& t) : rank_(t.inject_error_rank), step_(t.inject_error_step) {
  for (Phase p : kPhases)
    if (t.inject_error_phase == name(p)) phase_ = p;  // the schema allows only these names
}

void Faults::at(Phase p, int64_t step, int rank) const {
  if (step_ == 0 || step != step_ || p != phase_ || rank != rank_) return;
  throw Error("injected fault on rank " + std::to_string(rank) + " at step " + std::to_string(step) + " in phase " +
              name(p) + " (train.inject_error_*)");
}

}  // namespace sb
