// update: learning-rate schedule, gradient clipping by global norm, AdamW.
#pragma once
#include <cstdint>
#include <vector>

#include "src/config/config.hpp"
#include "src/model/model.hpp"

namespace sb {

struct OptimSettings {
  double lr, min_lr_ratio, weight_decay, beta1, beta2, eps, grad_clip;
  int64_t warmup_steps, total_steps;
  static OptimSettings from_config(const Config& cfg);
};

// Linear warmup to lr over warmup_steps, then cosine decay to lr * min_lr_ratio at total_steps.
// `step` counts from 1.
double lr_at(const OptimSettings& o, int64_t step);

// L2 norm of the whole gradient, accumulated in double.
double global_norm(const std::vector<float>& g);

class AdamW {
 public:
  AdamW(const OptimSettings& o, size_t n) : o_(o), m_(n, 0.f), v_(n, 0.f) {}
  // Clip `g` to grad_clip (when > 0) given its norm, then one AdamW step on `model`'s weights.
  // Weight decay only on tensors marked decay (matrices, not norms).
  void step(Model<float>& model, std::vector<float>& g, double grad_norm, double lr, int64_t step);
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }

 private:
  OptimSettings o_;
  std::vector<float> m_, v_;
};

}  // namespace sb
