// Fault injection, a testing aid (train.inject_error_rank/_step/_phase): one rank throws an
// sb::Error at the start of one phase of one step, so tests can check that an error on any rank,
// anywhere in the step, ends the whole job with the message (and never hangs it).
#pragma once
#include <cstdint>
#include <string>

#include "src/train/settings.hpp"

namespace sb {

class Faults {
 public:
  enum class Phase { Plan, Predict, Exchange, Tune, Compute, Reduce, Update, Measure, Record, Checkpoint };
  explicit Faults(const TrainSettings& t);
  // Throws when (phase, step, rank) is the configured one; free otherwise.
  void at(Phase p, int64_t step, int rank) const;
  static const char* name(Phase p);

 private:
  int64_t rank_ = 0, step_ = 0;  // step 0: off
  Phase phase_ = Phase::Compute;
};

}  // namespace sb
