// update: learning-rate schedule, gradient clipping by global norm, AdamW. One optimizer for both
// engines: the schedule, the clip factor and the per-tensor step are here; an engine supplies only
// where its arithmetic runs (host kernels, or CUDA kernels on device buffers).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "src/comm/comm.hpp"
#include "src/model/model.hpp"

namespace sb {

struct OptimSettings {
  double lr, min_lr_ratio, weight_decay, beta1, beta2, eps, grad_clip;
  int64_t warmup_steps, total_steps;
};

// Linear warmup to lr over warmup_steps, then cosine decay to lr * min_lr_ratio at total_steps
// (train.decay_steps, else train.steps), held at that floor after it.
// `step` counts from 1.
double lr_at(const OptimSettings& o, int64_t step);

// L2 norm of the whole gradient, accumulated in double.
double global_norm(const std::vector<float>& g);

// One tensor's AdamW arguments at one step (weight_decay already 0 on tensors without decay).
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};

class AdamW {
 public:
  // n: parameters; the host moments m(), v() (the CUDA engine keeps its own on the device and
  // copies them here for checkpoints). `slice`: the slice of the flat parameter buffer whose
  // moments this rank keeps and updates (train.zero = 1: slice_of(n, rank, ranks); else all).
  AdamW(const OptimSettings& o, size_t n) : AdamW(o, n, Slice{0, n}) {}
  AdamW(const OptimSettings& o, size_t n, Slice slice)
      : o_(o), n_(n), slice_(slice), m_(slice.size(), 0.f), v_(slice.size(), 0.f) {}
  const OptimSettings& settings() const { return o_; }
  size_t params() const { return n_; }
  Slice slice() const { return slice_; }
  double lr(int64_t step) const { return lr_at(o_, step); }
  // The factor that clips a gradient of norm grad_norm to grad_clip (1 when within it or off).
  float clip_factor(double grad_norm) const;
  // One step, wherever the arithmetic runs: scale(c) once when the gradient must be clipped, then
  // tensor(p, args) for every tensor of `layout` in order (decay on matrices, not norms).
  void step(const ParamLayout& layout, double grad_norm, double lr, int64_t step, const std::function<void(float)>& scale,
            const std::function<void(const ParamInfo&, const AdamWArgs&)>& tensor) const;
  // The host step: `g`, the gradient of slice() (slice().size() values), clipped in place, then
  // kernels::adamw on the slice of `model`'s weights and on m(), v() (each tensor's part of it).
  void step(Model<float>& model, std::span<float> g, double grad_norm, double lr, int64_t step);
  std::vector<float>& m() { return m_; }  // moments of slice(), slice().size() values
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }

 private:
  OptimSettings o_;
  size_t n_;
  Slice slice_;
  std::vector<float> m_, v_;
};

// "memory per rank: weights 1.2 MiB, gradients 1.2 MiB, optimizer 0.6 MiB (moments of 1/2 of the
// parameters, train.zero = 1), ...": what this rank holds for the parameters, and the peak host
// memory so far (VmHWM), for the start line and the summary.
// `frozen`: a LoRA run's frozen base (parameters, fp32), counted first when > 0.
std::string memory_line(const AdamW& opt, bool zero, size_t frozen = 0);

}  // namespace sb
