#include "src/engine/update.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numbers>

#include "kernels/kernels.hpp"

#include <algorithm>
#include <stdexcept>

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

void AdamW::step(Model<float>& model, std::span<float> g, double grad_norm, double lr, int64_t step) {
  if (g.size() != slice_.size()) throw std::logic_error("AdamW::step: gradient is not the size of the slice");
  float* w = model.weights().data();
  const size_t lo = slice_.lo;
  this->step(
      model.layout(), grad_norm, lr, step,
      [&](float c) {
        for (float& x : g) x *= c;
      },
      [&](const ParamInfo& p, const AdamWArgs& a) {  // the part of tensor p inside the slice, if any
        const size_t b = std::max(p.offset, lo), e = std::min(p.offset + p.size, slice_.hi);
        if (b >= e) return;
        kernels::adamw(w + b, g.data() + (b - lo), m_.data() + (b - lo), v_.data() + (b - lo), e - b, a.lr,
                       a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
      });
}

static double peak_host_mib() {  // VmHWM: the resident set's high-water mark
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

std::string memory_line(const AdamW& opt, bool zero, size_t frozen) {
  const size_t grad_slice_floats = zero ? opt.slice().size() : 0;  // the reduce-scatter's output
  const double mib = 1.0 / (1024.0 * 1024.0), n = double(opt.params());
  const double opt_mib = double(opt.m().size() + opt.v().size() + grad_slice_floats) * sizeof(float) * mib;
  char base[64] = "";
  if (frozen) std::snprintf(base, sizeof base, "frozen base %.1f MiB, ", double(frozen) * sizeof(float) * mib);
  char buf[384];
  std::snprintf(buf, sizeof buf,
                "memory per rank: %sweights %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB (AdamW moments%s of %zu "
                "of %zu parameters, train.zero = %d); peak host %.1f MiB",
                base, n * sizeof(float) * mib, n * sizeof(float) * mib, opt_mib, grad_slice_floats ? " and reduced gradient" : "",
                opt.slice().size(), opt.params(), zero ? 1 : 0, peak_host_mib());
  return buf;
}

}  // namespace sb
