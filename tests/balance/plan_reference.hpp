// The original (pre-optimisation) SAB planner, kept verbatim as a reference: the fast make_plan
// must produce exactly the same plan (Plan::hash) on every input. Test-only.
#pragma once
#include <algorithm>
#include <cmath>
#include <queue>
#include <set>
#include <tuple>

#include "src/balance/plan.hpp"
#include "base/error.hpp"

namespace sb::ref {
namespace {

Plan sequential_plan(std::span<const Segment> segs, int R, int64_t cap) {
  Plan p;
  p.ranks.resize(size_t(R));
  size_t n = segs.size();
  for (int r = 0; r < R; ++r) {
    size_t lo = n * size_t(r) / size_t(R), hi = n * size_t(r + 1) / size_t(R);
    auto& mbs = p.ranks[size_t(r)];
    for (size_t i = lo; i < hi; ++i) {
      if (mbs.empty() || mbs.back().tokens + int64_t(segs[i].len) > cap) mbs.emplace_back();
      mbs.back().segs.push_back(segs[i]);
      mbs.back().tokens += int64_t(segs[i].len);
    }
  }
  return p;
}

// One segment in placement order, with what LPT reads (sequential access: large batches).
struct Item {
  double cost;
  int64_t len;
  uint32_t idx;
};

// Segments costliest first (ties: lower index). Cost depends only on the length, so it is
// computed once per distinct length; order by length with a counting sort, O(n + capacity).
std::vector<Item> lpt_order(std::span<const Segment> segs, int64_t cap, Batching b, const LatencyModel& lm, int k0) {
  size_t n = segs.size();
  std::vector<uint32_t> count(size_t(cap) + 2, 0);
  for (const auto& s : segs) ++count[size_t(cap - int64_t(s.len))];  // longest first
  uint32_t acc = 0;
  for (auto& c : count) std::swap(c, acc), acc += c;
  std::vector<Item> items(n);
  for (size_t i = 0; i < n; ++i) items[count[size_t(cap - int64_t(segs[i].len))]++] = {0.0, int64_t(segs[i].len), uint32_t(i)};
  int64_t last_len = -1;
  double last = 0;
  bool monotone = true;
  for (auto& it : items) {
    if (it.len != last_len) {
      double c = b == Batching::Tokens ? double(it.len)
                 : b == Batching::Quadratic ? lm.dense_segment_cost(it.len)
                                            : lm.segment_cost(it.len, k0);
      if (last_len >= 0 && c > last) monotone = false;  // a fitted profile may be non-monotone
      last = c, last_len = it.len;
    }
    it.cost = last;
  }
  if (!monotone)
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& c) { return a.cost > c.cost; });
  return items;
}

// Iterative segment tree: the least load over all ranks (ties: lower rank) in O(1), updates O(log R).
struct MinTree {
  int n;
  std::vector<std::pair<double, int>> t;
  explicit MinTree(int n_) : n(1) {
    while (n < n_) n *= 2;
    t.assign(size_t(2 * n), {1e300, INT32_MAX});
    for (int i = 0; i < n_; ++i) t[size_t(n + i)] = {0.0, i};
    for (int i = n - 1; i >= 1; --i) t[size_t(i)] = std::min(t[size_t(2 * i)], t[size_t(2 * i + 1)]);
  }
  void set(int i, double v) {
    size_t x = size_t(n + i);
    t[x].first = v;
    for (x /= 2; x >= 1; x /= 2) t[x] = std::min(t[2 * x], t[2 * x + 1]);
  }
  int argmin() const { return t[1].second; }
};

struct Packer {
  int R, M;
  int64_t cap;
  std::vector<double> load;                   // [rank]
  std::vector<std::vector<int64_t>> free;     // [rank][mb] free tokens
  std::vector<int64_t> max_free;              // [rank]
  std::vector<int32_t> where_rank, where_mb;  // [segment]

  Packer(int R_, int M_, int64_t cap_, size_t n)
      : R(R_), M(M_), cap(cap_), load(size_t(R_), 0.0), free(size_t(R_), std::vector<int64_t>(size_t(M_), cap_)),
        max_free(size_t(R_), cap_), where_rank(n, -1), where_mb(n, -1) {}

  // Fullest micro-batch of rank r with room for len (ties: lower index); -1 if none.
  int best_fit(int r, int64_t len) const {
    int best = -1;
    const auto& f = free[size_t(r)];
    for (int m = 0; m < int(f.size()); ++m)
      if (f[size_t(m)] >= len && (best < 0 || f[size_t(m)] < f[size_t(best)])) best = m;
    return best;
  }
  void refresh(int r) { max_free[size_t(r)] = *std::max_element(free[size_t(r)].begin(), free[size_t(r)].end()); }
  void put(size_t i, int r, int m, int64_t len, double c) {
    free[size_t(r)][size_t(m)] -= len;
    load[size_t(r)] += c;
    where_rank[i] = r, where_mb[i] = m;
    refresh(r);
  }
  void take(size_t i, int64_t len, double c) {
    int r = where_rank[i], m = where_mb[i];
    free[size_t(r)][size_t(m)] += len;
    load[size_t(r)] -= c;
    refresh(r);
  }
};

// Improving moves and swaps between the most and the least loaded rank (SAB's local search).
void improve(Packer& pk, std::span<const Segment> segs, const std::vector<double>& cost, int rounds) {
  std::vector<std::vector<uint32_t>> members(size_t(pk.R));
  for (size_t i = 0; i < segs.size(); ++i) members[size_t(pk.where_rank[i])].push_back(uint32_t(i));
  std::set<std::pair<double, int>> byload;
  for (int r = 0; r < pk.R; ++r) byload.insert({pk.load[size_t(r)], r});
  std::vector<uint32_t> bsorted;
  for (int round = 0; round < rounds && byload.size() > 1; ++round) {
    int a = byload.rbegin()->second, b = byload.begin()->second;
    double d = pk.load[size_t(a)] - pk.load[size_t(b)];
    if (d <= 1e-9 * std::max(1.0, pk.load[size_t(a)])) break;
    // Best exchange: a gives x (cost cx), b gives y (cost cy, or nothing); delta = cx - cy in (0, d),
    // closest to d/2 minimises the new pair maximum.
    double best_gap = d / 2;  // must beat "no change" (|delta - d/2| = d/2)
    int64_t bx = -1, by = -1;
    int bmb_x = -1, bmb_y = -1;
    bsorted = members[size_t(b)];
    std::sort(bsorted.begin(), bsorted.end(), [&](uint32_t u, uint32_t v) { return cost[u] < cost[v] || (cost[u] == cost[v] && u < v); });
    for (uint32_t x : members[size_t(a)]) {
      double cx = cost[x];
      int64_t lx = int64_t(segs[x].len);
      // Move x to b.
      if (cx < d && std::abs(cx - d / 2) < best_gap - 1e-12) {
        int m = pk.best_fit(b, lx);
        if (m >= 0) best_gap = std::abs(cx - d / 2), bx = x, by = -1, bmb_x = m;
      }
      // Swap with y near cost cx - d/2: look at a few neighbours of the insertion point.
      double want = cx - d / 2;
      auto it = std::lower_bound(bsorted.begin(), bsorted.end(), want, [&](uint32_t u, double w) { return cost[u] < w; });
      ptrdiff_t pos = it - bsorted.begin();
      for (ptrdiff_t j = std::max<ptrdiff_t>(0, pos - 3); j < std::min<ptrdiff_t>(ptrdiff_t(bsorted.size()), pos + 3); ++j) {
        uint32_t y = bsorted[size_t(j)];
        double delta = cx - cost[y];
        if (delta <= 0 || delta >= d || std::abs(delta - d / 2) >= best_gap - 1e-12) continue;
        int64_t ly = int64_t(segs[y].len);
        int mx = pk.where_mb[x], my = pk.where_mb[y];
        if (pk.free[size_t(a)][size_t(mx)] + lx < ly || pk.free[size_t(b)][size_t(my)] + ly < lx) continue;
        best_gap = std::abs(delta - d / 2), bx = x, by = y, bmb_x = my, bmb_y = mx;
      }
    }
    if (bx < 0) break;  // nothing improves the pair: SAB is done
    byload.erase({pk.load[size_t(a)], a});
    byload.erase({pk.load[size_t(b)], b});
    int64_t lx = int64_t(segs[size_t(bx)].len);
    pk.take(size_t(bx), lx, cost[size_t(bx)]);
    if (by >= 0) {
      int64_t ly = int64_t(segs[size_t(by)].len);
      pk.take(size_t(by), ly, cost[size_t(by)]);
      pk.put(size_t(by), a, bmb_y, ly, cost[size_t(by)]);
      auto& mb_ = members[size_t(b)];
      mb_.erase(std::find(mb_.begin(), mb_.end(), uint32_t(by)));
      members[size_t(a)].push_back(uint32_t(by));
    }
    pk.put(size_t(bx), b, bmb_x, lx, cost[size_t(bx)]);
    auto& ma = members[size_t(a)];
    ma.erase(std::find(ma.begin(), ma.end(), uint32_t(bx)));
    members[size_t(b)].push_back(uint32_t(bx));
    byload.insert({pk.load[size_t(a)], a});
    byload.insert({pk.load[size_t(b)], b});
  }
}

}  // namespace

inline Plan reference_make_plan(std::span<const Segment> segs, int ranks, int micro_batches_per_rank, int64_t capacity, Batching batching,
               const LatencyModel& lm, int k0, const PlanOptions& opt) {
  if (ranks < 1) throw Error("make_plan: ranks = " + std::to_string(ranks) + " must be >= 1");
  if (micro_batches_per_rank < 1) throw Error("make_plan: micro-batches per rank = " + std::to_string(micro_batches_per_rank) + " must be >= 1");
  for (const auto& s : segs)
    if (int64_t(s.len) > capacity)
      throw Error("make_plan: segment of document " + std::to_string(s.doc) + " has " + std::to_string(s.len) +
                  " tokens, more than the capacity " + std::to_string(capacity) + " (train.micro_batch_tokens); window it first (make_segments)");
  if (batching == Batching::Sequential) return sequential_plan(segs, ranks, capacity);

  std::vector<Item> order = lpt_order(segs, capacity, batching, lm, k0);
  std::vector<double> cost(segs.size());
  for (const auto& it : order) cost[it.idx] = it.cost;
  Packer pk(ranks, micro_batches_per_rank, capacity, segs.size());
  // Min-heap of (load, rank) over ranks that may have room. A rank without room for the current
  // segment waits in `aside` (max-heap by its largest free space) until a segment fits it again:
  // each rank is set aside at most once per placement it receives, so LPT stays O(n log R).
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  std::priority_queue<std::tuple<int64_t, int, int>> aside;  // (max_free, rank, version)
  std::vector<int> version(size_t(ranks), 0);
  MinTree least(ranks);  // argmin of load over all ranks, for the no-room case
  for (int r = 0; r < ranks; ++r) heap.push({0.0, r});
  for (const Item& item : order) {
    const uint32_t i = item.idx;
    const int64_t len = item.len;
    while (!aside.empty() && std::get<0>(aside.top()) >= len) {
      auto [f, r, v] = aside.top();
      aside.pop();
      if (v == version[size_t(r)]) heap.push({pk.load[size_t(r)], r});
    }
    int r = -1, m = -1;
    while (!heap.empty()) {
      int top = heap.top().second;
      heap.pop();
      if (pk.max_free[size_t(top)] >= len) { r = top, m = pk.best_fit(r, len); break; }
      aside.push({pk.max_free[size_t(top)], top, version[size_t(top)]});
    }
    if (r < 0) {  // no room anywhere: an extra micro-batch on the least-loaded rank
      r = least.argmin();
      pk.free[size_t(r)].push_back(capacity);
      m = int(pk.free[size_t(r)].size()) - 1;
      ++version[size_t(r)];  // its entry in `aside` is now stale
    }
    pk.put(i, r, m, len, item.cost);
    least.set(r, pk.load[size_t(r)]);
    heap.push({pk.load[size_t(r)], r});
  }
  if (batching == Batching::Sparse) improve(pk, segs, cost, opt.swap_rounds);

  // Materialise: micro-batches keep segments in data order; empty micro-batches are dropped.
  Plan p;
  p.ranks.resize(size_t(ranks));
  std::vector<std::vector<MicroBatch>> bins(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) bins[size_t(r)].resize(pk.free[size_t(r)].size());
  for (size_t i = 0; i < segs.size(); ++i) {
    auto& mb = bins[size_t(pk.where_rank[i])][size_t(pk.where_mb[i])];
    mb.segs.push_back(segs[i]);
    mb.tokens += int64_t(segs[i].len);
  }
  for (int r = 0; r < ranks; ++r)
    for (auto& mb : bins[size_t(r)])
      if (!mb.segs.empty()) p.ranks[size_t(r)].push_back(std::move(mb));
  return p;
}

}  // namespace sb::ref
