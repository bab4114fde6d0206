// DST's greedy tuner: one rank's budgets toward a target time T*, per (micro-batch, layer).
#pragma once
#include <utility>
#include <vector>

#include "src/balance/dst.hpp"

namespace sb {

struct TuneResult {
  std::vector<std::vector<int>> k;        // [micro-batch][layer] budgets for THIS rank
  double target_ms = 0;                   // T*, identical on every rank
  std::vector<double> rank_predicted_ms;  // all ranks after tuning, from the summaries (identical on
                                          // every rank; exact up to one budget step)
  double planned_imbalance_before = 1, planned_imbalance_after = 1;  // max/mean of predicted rank times
  double my_predicted_ms = 0;             // this rank after tuning, exact
  double my_recall = 1;                   // this rank's mean recall after tuning (token-weighted)
  double my_weight = 0;                   // its recall weight (tokens x layers)
};

// Greedy tuning of one rank's items toward T* (bidirectional); fills k, my_* fields.
TuneResult tune_rank(const DstItems& items, double target_ms, const DstParams& p);

namespace dst {

// The greedy state of one rank: a budget step per item (item = mb * n_layers + layer).
struct State {
  std::vector<int> step;
  double ms = 0, rec = 0;
};

State initial(const DstItems& it);  // every item at k0
// Lower budgets (smallest recall lost per ms saved first) until ms <= T or all at the bound;
// or raise (largest recall gained per ms first) while staying <= T. Ties: lower item index.
// `path` (optional) records (ms, rec) after every applied move.
void greedy(const DstItems& it, State& s, double T, bool down, std::vector<std::pair<double, double>>* path);

}  // namespace dst

}  // namespace sb
