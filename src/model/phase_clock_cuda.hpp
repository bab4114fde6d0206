// Per-phase GPU time of the training step from CUDA events, on with train.phase_times (set_on; off,
// the default: every call returns at once). The stream's timeline is cut into consecutive intervals: mark(p) records an
// event, and the time from it to the next mark (or end()) is phase p's, so host waits inside an
// interval (a synchronisation, a host-built selection) count in that phase. collect() after the
// stream is synchronised adds the intervals to the per-phase totals; the CUDA engine prints them
// once per step with the idle remainder (the step's wall time not covered by any interval).
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <utility>
#include <vector>

#include "base/cuda_check.hpp"

namespace sb {

enum class Phase { attn_fwd, attn_bwd, gemm, gating, elementwise, head_loss, optimizer, allreduce, count };
constexpr int kPhases = int(Phase::count);
inline constexpr std::array<const char*, kPhases> kPhaseNames = {
    "attn_fwd", "attn_bwd", "gemm", "gating+select", "norm/rope/swiglu/residual", "lm_head+loss", "optimizer",
    "allreduce"};

class PhaseClock {
 public:
  PhaseClock() = default;
  ~PhaseClock() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);  // no check in a destructor
  }
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  bool on() const { return on_; }
  void set_on(bool on) { on_ = on; }
  void mark(Phase p, cudaStream_t s) { record(int(p), s); }
  void end(cudaStream_t s) { record(-1, s); }
  // After the stream is synchronised: the closed intervals into totals(); the marks are reused.
  void collect() {
    for (size_t i = 0; i + 1 < used_; i++) {
      if (label_[i] < 0) continue;
      float ms = 0;
      SB_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
      totals_[size_t(label_[i])] += ms;
    }
    used_ = 0;
  }
  std::array<double, kPhases>& totals() { return totals_; }

 private:
  void record(int label, cudaStream_t s) {
    if (!on_) return;
    if (used_ == events_.size()) {
      cudaEvent_t e;
      SB_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
      label_.push_back(0);
    }
    SB_CUDA_CHECK(cudaEventRecord(events_[used_], s));
    label_[used_++] = label;
  }
  bool on_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<int> label_;
  size_t used_ = 0;
  std::array<double, kPhases> totals_{};
};

}  // namespace sb
