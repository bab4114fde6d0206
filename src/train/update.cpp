#include "src/train/update.hpp"

#include <cmath>
#include <numbers>

#include "kernels/kernels.hpp"

namespace sb {

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

float AdamW::clip_factor(double grad_norm) const {
  return o_.grad_clip > 0 && grad_norm > o_.grad_clip ? float(o_.grad_clip / grad_norm) : 1.f;
}

void AdamW::step(const ParamLayout& layout, double grad_norm, double lr, int64_t step,
                 const std::function<void(float)>& scale,
                 const std::function<void(const ParamInfo&, const AdamWArgs&)>& tensor) const {
  if (const float c = clip_factor(grad_norm); c != 1.f) scale(c);
  for (const auto& p : layout.params)
    tensor(p, {float(lr), float(o_.beta1), float(o_.beta2), float(o_.eps), p.decay ? float(o_.weight_decay) : 0.f, step});
}

void AdamW::step(Model<float>& model, std::vector<float>& g, double grad_norm, double lr, int64_t step) {
  float* w = model.weights().data();
  this->step(
      model.layout(), grad_norm, lr, step,
      [&](float c) {
        for (float& x : g) x *= c;
      },
      [&](const ParamInfo& p, const AdamWArgs& a) {
        kernels::adamw(w + p.offset, g.data() + p.offset, m_.data() + p.offset, v_.data() + p.offset, p.size, a.lr,
                       a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
      });
}

}  // namespace sb
