// Launch order of the attention kernels' CTAs (one per (block, head)): which work items start first.
// Plain C++ (no CUDA), so that the CPU tests check it. CTAs start roughly in index order, each on the
// next free SM, so the order is a list schedule:
//   heads   head-outer, heaviest first within a head. Concurrent CTAs share a head, so its K/V (or
//           Q/dO) stay in L2, but the last head's heaviest CTAs start near the end and leave a tail
//           as long as they are: at density 0.1 the backward's key block 0, which every query block
//           keeps, has ten times the average work.
//   blocks  heaviest first over all heads (longest-processing-time list scheduling): no tail, but
//           concurrent CTAs spread over all heads and L2 reuse suffers (measured 5-11% slower at
//           density 0.5 on an H200, bench/results/2026-11-29-tma-cta-order.md).
//   mixed   (default) the head-outer order, except that items which finish more than 3% past the
//           best possible makespan (max of mean load per slot and largest item) in a simulation of
//           that list schedule go first, heaviest first (repeated until none does).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sb::kernels {

enum class CtaOrder { mixed, heads, blocks };

// The order named s (null or empty: mixed): bench_attention_cuda's --order.
inline CtaOrder parse_cta_order(const char* s) {
  if (!s || !*s || std::string_view(s) == "mixed") return CtaOrder::mixed;
  if (std::string_view(s) == "heads") return CtaOrder::heads;
  if (std::string_view(s) == "blocks") return CtaOrder::blocks;
  throw std::invalid_argument(std::string("launch order '") + s + "': expected mixed, heads or blocks");
}

// work[bi * n_heads + h]: cost of block bi for head h (any unit). Returns the item indices
// bi * n_heads + h in launch order. slots: CTAs that run at once (SMs x CTAs per SM), >= 1.
inline std::vector<int32_t> cta_order(const std::vector<int64_t>& work, int n_heads, int slots, CtaOrder mode) {
  if (n_heads < 1 || slots < 1 || work.size() % size_t(n_heads) != 0)
    throw std::invalid_argument("cta_order: work must hold n_blocks x n_heads items, n_heads and slots >= 1");
  if (work.size() > size_t(INT32_MAX)) throw std::invalid_argument("cta_order: more than 2^31 items");
  std::vector<int32_t> idx(work.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto heavier = [&](int32_t a, int32_t b) { return work[a] > work[b]; };  // stable: ties by index
  if (mode == CtaOrder::blocks) {
    std::stable_sort(idx.begin(), idx.end(), heavier);
    return idx;
  }
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    const int ha = a % n_heads, hb = b % n_heads;
    return ha != hb ? ha < hb : work[a] > work[b];
  });
  if (mode == CtaOrder::heads) return idx;
  // Simulate the list schedule; items that finish more than 3% past the best possible makespan go
  // to the front; repeat with the new order until none does (a few passes).
  const double total = std::accumulate(work.begin(), work.end(), 0.0);
  const double wmax = work.empty() ? 0.0 : double(*std::max_element(work.begin(), work.end()));
  const double limit = 1.03 * std::max(total / slots, wmax);
  std::vector<char> is_early(work.size(), 0);
  std::vector<int32_t> early, rest, order = idx;
  for (int pass = 0; pass < 8; pass++) {
    std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
    for (int s = 0; s < slots; s++) free_at.push(0.0);
    bool moved = false;
    for (int32_t x : order) {
      const double end = free_at.top() + double(work[x]);
      free_at.pop();
      free_at.push(end);
      if (end > limit && !is_early[x]) is_early[x] = 1, moved = true;
    }
    if (!moved) break;
    early.clear();
    rest.clear();
    for (int32_t x : idx) (is_early[x] ? early : rest).push_back(x);
    std::stable_sort(early.begin(), early.end(), heavier);
    order = early;
    order.insert(order.end(), rest.begin(), rest.end());
  }
  return order;
}

// The mixed order as the device builds it (kernels/cuda/select_device.cu): instead of simulating the
// list schedule, an item's finish time is bounded by prefix / slots + work, where prefix is the work
// launched before it (a list schedule starts an item no later than that: every slot is busy until
// then). Items whose bound exceeds the same limit go first, heaviest first with ties by index (the
// `blocks` order restricted to them); the rest follow in the `heads` order; repeated while an item is
// added (at most 8 passes). A permutation of the items by construction. Plain arithmetic in the order
// the device uses, so both give the same order.
inline std::vector<int32_t> cta_order_bounded(const std::vector<int64_t>& work, int n_heads, int slots) {
  const std::vector<int32_t> by_work = cta_order(work, n_heads, slots, CtaOrder::blocks);
  const std::vector<int32_t> by_head = cta_order(work, n_heads, slots, CtaOrder::heads);
  int64_t total = 0, wmax = 0;
  for (int64_t w : work) total += w, wmax = std::max(wmax, w);
  const double limit = 1.03 * std::max(double(total) / double(slots), double(wmax));
  std::vector<char> is_early(work.size(), 0);
  std::vector<int32_t> order = by_head;
  for (int pass = 0; pass < 8; pass++) {
    bool moved = false;
    int64_t prefix = 0;
    for (int32_t x : order) {
      if (double(prefix) / double(slots) + double(work[x]) > limit && !is_early[x]) is_early[x] = 1, moved = true;
      prefix += work[x];
    }
    if (!moved) break;
    order.clear();
    for (int32_t x : by_work)
      if (is_early[x]) order.push_back(x);
    for (int32_t x : by_head)
      if (!is_early[x]) order.push_back(x);
  }
  return order;
}

// Makespan of a list schedule: items in `order` each start on the earliest free of `slots` slots.
inline double list_makespan(const std::vector<int64_t>& work, const std::vector<int32_t>& order, int slots) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int s = 0; s < std::max(slots, 1); s++) free_at.push(0.0);
  double end = 0;
  for (int32_t x : order) {
    const double e = free_at.top() + double(work[size_t(x)]);
    free_at.pop();
    free_at.push(e);
    end = std::max(end, e);
  }
  return end;
}

}  // namespace sb::kernels
