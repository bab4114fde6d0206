// The least busy window of G consecutive ranks, for place_long_docs (plan.cpp).
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>
#include <vector>

namespace sb {

// The windows of G consecutive ranks, f(s) = max(load[s .. s+G-1]) for s in [0, R-G], in a segment
// tree of (f, s) minima: the least busy window is the root (ties: lower s), and a placement on
// [a, a+n) updates only the windows that overlap it, O(G + n + log R), when that size is next asked
// for (overlapping updates merged, or all windows at once after many). The plain scan was
// O(R x G) per group, most of the planning time at 4,096 ranks (bench/results/2026-12-01-parts-at-bound.md).
class WindowMax {
 public:
  // Built from the load as it is after the first `seen` placements of the log.
  WindowMax(const std::vector<double>& load, int G, size_t seen) : G_(G), n_(int(load.size()) - G + 1), seen_(seen) {
    while (P_ < n_) P_ *= 2;
    t_.assign(size_t(2 * P_), {HUGE_VAL, INT32_MAX});
    refresh(load, 0, n_ - 1);
  }
  // The lowest start of a least busy window, after the placements log[seen..] (first rank, ranks):
  // the windows they overlap are refreshed now, overlapping ranges once (many sizes are seldom asked).
  int best(const std::vector<double>& load, const std::vector<std::pair<int, int>>& log) {
    if (log.size() - seen_ > size_t(n_ / 16 + 1)) {  // many since: one pass over all windows is cheaper
      refresh(load, 0, n_ - 1);
    } else if (seen_ < log.size()) {
      pending_.clear();
      for (size_t q = seen_; q < log.size(); ++q) {
        const int lo = std::max(0, log[q].first - G_ + 1), hi = std::min(n_ - 1, log[q].first + log[q].second - 1);
        if (lo <= hi) pending_.push_back({lo, hi});
      }
      std::sort(pending_.begin(), pending_.end());
      for (size_t q = 0; q < pending_.size();) {
        auto [lo, hi] = pending_[q];
        for (++q; q < pending_.size() && pending_[q].first <= hi + 1; ++q) hi = std::max(hi, pending_[q].second);
        refresh(load, lo, hi);
      }
    }
    seen_ = log.size();
    return t_[1].second;
  }
  double best_max() const { return t_[1].first; }  // that window's maximum (after best())

 private:
  int G_, n_, P_ = 1;
  size_t seen_;
  std::vector<std::pair<double, int>> t_;  // [node] (f, s); leaves at P_ + s
  std::vector<int> dq_;                    // the sliding maximum's candidate ranks
  std::vector<std::pair<int, int>> pending_;  // ranges of starts to refresh

  // Recompute f(s) for s in [lo, hi] (a monotonic deque over load[lo .. hi+G-1]), then their ancestors.
  void refresh(const std::vector<double>& load, int lo, int hi) {
    if (lo > hi) return;
    dq_.clear();
    size_t head = 0;
    for (int r = lo; r <= hi + G_ - 1; ++r) {
      while (dq_.size() > head && load[size_t(dq_.back())] <= load[size_t(r)]) dq_.pop_back();
      dq_.push_back(r);
      const int s = r - G_ + 1;
      if (s < lo) continue;
      if (dq_[head] < s) ++head;
      t_[size_t(P_ + s)] = {load[size_t(dq_[head])], s};
    }
    for (int l = (P_ + lo) / 2, h = (P_ + hi) / 2; l >= 1; l /= 2, h /= 2)
      for (int v = l; v <= h; ++v) t_[size_t(v)] = std::min(t_[size_t(2 * v)], t_[size_t(2 * v + 1)]);
  }
};

}  // namespace sb
