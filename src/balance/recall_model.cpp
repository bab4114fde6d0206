#include "src/balance/recall_model.hpp"

#include <algorithm>
#include <cmath>

namespace sb {

static constexpr int64_t kPrefixLen = 8192;

RecallModel::RecallModel(ModelShape shape, double alpha, double ema)
    : shape_(shape), ema_(ema), alpha_(size_t(shape.n_layers), alpha), prefix_(size_t(shape.n_layers)), kpow_(size_t(shape.n_layers)) {
  for (int l = 0; l < shape.n_layers; ++l) rebuild(l);
}

void RecallModel::set_alpha(int layer, double a) {
  alpha_.at(size_t(layer)) = std::clamp(a, 0.01, 5.0);
  rebuild(layer);
}

void RecallModel::rebuild(int layer) {
  auto& p = prefix_[size_t(layer)];
  p.assign(kPrefixLen + 1, 0.0);
  auto& kp = kpow_[size_t(layer)];
  kp.assign(kPrefixLen + 1, 0.0);
  for (int64_t m = 1; m <= kPrefixLen; ++m) {
    p[size_t(m)] = p[size_t(m - 1)] + std::pow(double(m), -alpha_[size_t(layer)]);
    kp[size_t(m)] = std::pow(double(m), alpha_[size_t(layer)]);
  }
}

double RecallModel::power_sum(int layer, int64_t n) const {
  const auto& p = prefix_[size_t(layer)];
  if (n <= kPrefixLen) return p[size_t(n)];
  // Beyond the table: midpoint integral of m^-alpha (error far below what DST can resolve).
  double a = alpha_[size_t(layer)], lo = double(kPrefixLen) + 0.5, hi = double(n) + 0.5;
  double tail = std::abs(1 - a) < 1e-9 ? std::log(hi / lo) : (std::pow(hi, 1 - a) - std::pow(lo, 1 - a)) / (1 - a);
  return p[size_t(kPrefixLen)] + tail;
}

double RecallModel::recall(int layer, int64_t len, int k) const {
  int64_t nb = (len + shape_.block_size - 1) / shape_.block_size;
  if (nb <= 0) return 1.0;
  // Row i (causal blocks m = i+1) keeps min(m, w+2+k) blocks; recall (kept/m)^alpha.
  int64_t K = shape_.local_blocks + 2 + std::max(k, 0);
  if (nb <= K) return 1.0;
  double kpow = K <= kPrefixLen ? kpow_[size_t(layer)][size_t(K)] : std::pow(double(K), alpha_[size_t(layer)]);
  double sum = double(K) + kpow * (power_sum(layer, nb) - power_sum(layer, K));
  return sum / double(nb);
}

void RecallModel::observe(int layer, double x, double r) {
  if (!(x > 0 && x < 1) || !(r > 0 && r < 1)) return;
  double sample = std::log(r) / std::log(x);
  set_alpha(layer, (1 - ema_) * alpha_[size_t(layer)] + ema_ * sample);
}

}  // namespace sb
