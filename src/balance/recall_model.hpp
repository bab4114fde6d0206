// The recall side of DST's trade (DESIGN.md, "DST"); the time side is latency_model.hpp.
#pragma once
#include <cstdint>
#include <vector>

#include "src/balance/latency_model.hpp"  // ModelShape

namespace sb {

// Attention recall model: per layer, the recall of a query row keeping fraction x of its causal
// blocks is x^alpha_l; alpha_l is learned online from observed (x, recall) pairs.
class RecallModel {
 public:
  RecallModel(ModelShape shape = {}, double alpha = 0.5, double ema = 0.3);
  int n_layers() const { return shape_.n_layers; }
  const ModelShape& shape() const { return shape_; }
  double alpha(int layer) const { return alpha_[layer]; }
  void set_alpha(int layer, double a);
  // Mean recall over the query rows of one sequence of length len at budget k, layer `layer`.
  double recall(int layer, int64_t len, int k) const;
  // Sum over rows of recall, weighted to tokens (recall(layer,len,k) * len): what DST adds up.
  double recall_tokens(int layer, int64_t len, int k) const { return recall(layer, len, k) * double(len); }
  // One measured pair: kept fraction x of a layer (kept/causal) and the measured mean recall.
  // alpha <- (1-ema)*alpha + ema*log(recall)/log(x)  (skipped when x or recall is 0 or 1).
  void observe(int layer, double kept_fraction, double recall);

 private:
  double power_sum(int layer, int64_t n) const;  // sum_{m=1..n} m^-alpha
  void rebuild(int layer);
  ModelShape shape_;
  double ema_;
  std::vector<double> alpha_;
  std::vector<std::vector<double>> prefix_;  // per layer, prefix sums of m^-alpha
  std::vector<std::vector<double>> kpow_;    // per layer, K^alpha (recall() is table lookups)
};

}  // namespace sb
