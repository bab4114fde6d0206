#include "src/train/update.hpp"

#include <cmath>
#include <numbers>

#include "kernels/kernels.hpp"

namespace sb {

OptimSettings OptimSettings::from_config(const Config& cfg) {
  return {cfg.f("train.lr"),    cfg.f("train.min_lr_ratio"), cfg.f("train.weight_decay"),
          cfg.f("train.beta1"), cfg.f("train.beta2"),        cfg.f("train.adam_eps"),
          cfg.f("train.grad_clip"), cfg.i("train.warmup_steps"), cfg.i("train.steps")};
}

double lr_at(const OptimSettings& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) return o.lr * double(step) / double(o.warmup_steps);
  int64_t decay = o.total_steps - o.warmup_steps;
  if (decay <= 0) return o.lr;
  double t = std::min(1.0, double(step - o.warmup_steps) / double(decay));
  double floor = o.lr * o.min_lr_ratio;
  return floor + 0.5 * (o.lr - floor) * (1.0 + std::cos(std::numbers::pi * t));
}

double global_norm(const std::vector<float>& g) {
  double s = 0;
  for (float x : g) s += double(x) * double(x);
  return std::sqrt(s);
}

void AdamW::step(Model<float>& model, std::vector<float>& g, double grad_norm, double lr, int64_t step) {
  if (o_.grad_clip > 0 && grad_norm > o_.grad_clip) {
    float c = float(o_.grad_clip / grad_norm);
    for (float& x : g) x *= c;
  }
  float* w = model.weights().data();
  for (const auto& p : model.params())
    kernels::adamw(w + p.offset, g.data() + p.offset, m_.data() + p.offset, v_.data() + p.offset, p.size,
                   float(lr), float(o_.beta1), float(o_.beta2), float(o_.eps),
                   p.decay ? float(o_.weight_decay) : 0.f, step);
}

}  // namespace sb
