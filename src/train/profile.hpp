// profile: time the model's parts on this machine over a grid of sequence lengths and budgets,
// and fit the latency model (DESIGN.md, "Latency predictor").
#pragma once
#include <string>

#include "src/balance/latency_model.hpp"
#include "src/comm/comm.hpp"
#include "src/train/settings.hpp"
#include "src/model/model.hpp"

namespace sb {

struct ProfileReport {
  LatencyModel model;
  FitReport attention, gating, linear, allreduce;
  int samples = 0;
  double seconds = 0;
};

// Runs the configured model (random weights and tokens) on train.device forward+backward on single sequences of
// several lengths up to train.micro_batch_tokens at several budgets around attention.k, times
// attention (per layer), gating (per layer) and the token-linear rest, and the gradient
// all-reduce over the ranks at several sizes; fits each part. The vocabulary is s.model.vocab. `quick` uses a smaller grid (the
// brief self-profile `train` runs when no balance.profile is given). Collective: every rank calls it.
ProfileReport profile_machine(const Settings& s, const Comm& comm, bool quick);

}  // namespace sb
