#include "src/balance/plan.hpp"

#include <algorithm>
#include <cmath>
#include <climits>
#include <functional>
#include <queue>
#include <set>
#include <tuple>

#include "base/error.hpp"
#include "base/named.hpp"

namespace sb {

std::vector<Segment> make_segments(std::span<const std::pair<uint64_t, uint64_t>> docs, int64_t capacity, bool reject) {
  if (capacity <= 0) throw Error("make_segments: capacity " + std::to_string(capacity) + " must be positive (train.micro_batch_tokens)");
  std::vector<Segment> out;
  out.reserve(docs.size());
  for (const auto& [doc, len] : docs) {
    if (len > uint64_t(capacity) && reject)
      throw Error("document " + std::to_string(doc) + " has " + std::to_string(len) +
                  " tokens, more than the micro-batch capacity of " + std::to_string(capacity) +
                  " tokens (train.micro_batch_tokens); raise train.micro_batch_tokens or set "
                  "data.long_docs = \"window\" to cut long documents into windows");
    for (uint64_t b = 0; b < len; b += uint64_t(capacity))
      out.push_back({doc, b, std::min<uint64_t>(uint64_t(capacity), len - b)});
  }
  return out;
}

constexpr Named<Batching> kBatchings[] = {
    {Batching::Sequential, "sequential"}, {Batching::Tokens, "tokens"}, {Batching::Quadratic, "quadratic"},
    {Batching::Sparse, "sparse"}};

Batching parse_batching(const std::string& s) { return parse_named(kBatchings, s, "balance.batching"); }
const char* batching_name(Batching b) { return name_of(kBatchings, b); }

uint64_t Plan::hash() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t x) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((x >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(ranks.size());
  for (const auto& r : ranks) {
    mix(r.size());
    for (const auto& mb : r) {
      mix(uint64_t(mb.tokens)), mix(mb.segs.size());
      for (const auto& s : mb.segs) mix(s.doc), mix(s.begin), mix(s.len);
    }
  }
  return h;
}

size_t Plan::segments() const {
  size_t n = 0;
  for (const auto& r : ranks)
    for (const auto& mb : r) n += mb.segs.size();
  return n;
}

namespace {

// Data order, `R` contiguous chunks of nearly equal segment count, each packed in order. Micro-batches
// are built with their exact sizes (no growth reallocations: this is the baseline's whole cost).
Plan sequential_plan(std::span<const Segment> segs, int R, int64_t cap) {
  Plan p;
  p.ranks.resize(size_t(R));
  size_t n = segs.size();
  for (int r = 0; r < R; ++r) {
    size_t lo = n * size_t(r) / size_t(R), hi = n * size_t(r + 1) / size_t(R);
    auto& mbs = p.ranks[size_t(r)];
    for (size_t i = lo; i < hi;) {
      size_t j = i;
      int64_t t = 0;
      while (j < hi && (j == i || t + int64_t(segs[j].len) <= cap)) t += int64_t(segs[j].len), ++j;
      MicroBatch mb;
      mb.segs.assign(segs.begin() + ptrdiff_t(i), segs.begin() + ptrdiff_t(j));
      mb.tokens = t;
      mbs.push_back(std::move(mb));
      i = j;
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

// Per-rank micro-batch free space: `M` regular micro-batches in one flat array (cache friendly),
// plus, rarely, extra micro-batches opened when no rank has room.
struct Packer {
  int R, M;
  int64_t cap;
  std::vector<double> load;                  // [rank]
  std::vector<int64_t> free;                 // [rank * M + mb] free tokens of the regular micro-batches
  std::vector<std::vector<int64_t>> extra;   // [rank][mb - M] free tokens of extra micro-batches
  std::vector<int64_t> max_free;             // [rank]
  std::vector<int32_t> where_rank, where_mb; // [segment]

  Packer(int R_, int M_, int64_t cap_, size_t n)
      : R(R_), M(M_), cap(cap_), load(size_t(R_), 0.0), free(size_t(R_) * size_t(M_), cap_), extra(size_t(R_)),
        max_free(size_t(R_), cap_), where_rank(n, -1), where_mb(n, -1) {}

  int n_mb(int r) const { return M + int(extra[size_t(r)].size()); }
  int64_t& at(int r, int m) { return m < M ? free[size_t(r) * size_t(M) + size_t(m)] : extra[size_t(r)][size_t(m - M)]; }
  int64_t at(int r, int m) const { return m < M ? free[size_t(r) * size_t(M) + size_t(m)] : extra[size_t(r)][size_t(m - M)]; }

  // Fullest micro-batch of rank r with room for len (ties: lower index); -1 if none.
  int best_fit(int r, int64_t len) const {
    int best = -1;
    int64_t bf = INT64_MAX;
    const int64_t* f = free.data() + size_t(r) * size_t(M);
    for (int m = 0; m < M; ++m)
      if (f[m] >= len && f[m] < bf) best = m, bf = f[m];
    const auto& e = extra[size_t(r)];
    for (size_t j = 0; j < e.size(); ++j)
      if (e[j] >= len && e[j] < bf) best = M + int(j), bf = e[j];
    return best;
  }
  void refresh(int r) {
    const int64_t* f = free.data() + size_t(r) * size_t(M);
    int64_t mx = f[0];
    for (int m = 1; m < M; ++m) mx = std::max(mx, f[m]);
    for (int64_t x : extra[size_t(r)]) mx = std::max(mx, x);
    max_free[size_t(r)] = mx;
  }
  int add_mb(int r) {
    extra[size_t(r)].push_back(cap);
    max_free[size_t(r)] = cap;
    return n_mb(r) - 1;
  }
  void put(size_t i, int r, int m, int64_t len, double c) {
    at(r, m) -= len;
    load[size_t(r)] += c;
    where_rank[i] = r, where_mb[i] = m;
    refresh(r);
  }
  void take(size_t i, int64_t len, double c) {
    int r = where_rank[i], m = where_mb[i];
    at(r, m) += len;
    load[size_t(r)] -= c;
    refresh(r);
  }
};

// Binary min-heap of (load, rank), ties by lower rank (the order std::pair gives), with an in-place
// "the top got heavier" update: LPT's common step costs one sift-down of log2(R) levels.
struct RankHeap {
  struct E {
    double load;
    int rank;
    bool operator<(const E& o) const { return load < o.load || (load == o.load && rank < o.rank); }
  };
  std::vector<E> h;
  bool empty() const { return h.empty(); }
  int top() const { return h[0].rank; }
  void push(double load, int rank) {
    size_t i = h.size();
    h.push_back({load, rank});
    E x = h[i];
    while (i > 0) {
      size_t p = (i - 1) / 2;
      if (!(x < h[p])) break;
      h[i] = h[p], i = p;
    }
    h[i] = x;
  }
  void sift_down(size_t i) {
    const size_t n = h.size();
    E x = h[i];
    for (;;) {
      size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && h[c + 1] < h[c]) ++c;
      if (!(h[c] < x)) break;
      h[i] = h[c], i = c;
    }
    h[i] = x;
  }
  void update_top(double load) { h[0].load = load, sift_down(0); }
  void pop() {
    h[0] = h.back();
    h.pop_back();
    if (!h.empty()) sift_down(0);
  }
};

// Segment indices grouped by rank, in increasing index (CSR over where_rank).
void by_rank(const Packer& pk, std::vector<uint32_t>& start, std::vector<uint32_t>& idx) {
  size_t n = pk.where_rank.size();
  start.assign(size_t(pk.R) + 1, 0);
  for (size_t i = 0; i < n; ++i) ++start[size_t(pk.where_rank[i]) + 1];
  for (int r = 0; r < pk.R; ++r) start[size_t(r) + 1] += start[size_t(r)];
  idx.resize(n);
  std::vector<uint32_t> pos(start.begin(), start.end() - 1);
  for (size_t i = 0; i < n; ++i) idx[pos[size_t(pk.where_rank[i])]++] = uint32_t(i);
}

// Improving moves and swaps between the most and the least loaded rank (SAB's local search).
// Member lists are materialised only for the ranks a round touches (a few of thousands).
void improve(Packer& pk, std::span<const Segment> segs, const std::vector<double>& cost, int rounds) {
  if (rounds <= 0 || pk.R < 2) return;
  std::vector<uint32_t> start, idx;
  by_rank(pk, start, idx);
  std::vector<std::vector<uint32_t>> members_(size_t(pk.R));
  std::vector<char> built(size_t(pk.R), 0);
  auto members = [&](int r) -> std::vector<uint32_t>& {
    if (!built[size_t(r)]) {
      built[size_t(r)] = 1;
      members_[size_t(r)].assign(idx.begin() + start[size_t(r)], idx.begin() + start[size_t(r) + 1]);
    }
    return members_[size_t(r)];
  };
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
    bsorted = members(b);
    std::sort(bsorted.begin(), bsorted.end(), [&](uint32_t u, uint32_t v) { return cost[u] < cost[v] || (cost[u] == cost[v] && u < v); });
    for (uint32_t x : members(a)) {
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
        if (pk.at(a, mx) + lx < ly || pk.at(b, my) + ly < lx) continue;
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
      auto& mb_ = members(b);
      mb_.erase(std::find(mb_.begin(), mb_.end(), uint32_t(by)));
      members(a).push_back(uint32_t(by));
    }
    pk.put(size_t(bx), b, bmb_x, lx, cost[size_t(bx)]);
    auto& ma = members(a);
    ma.erase(std::find(ma.begin(), ma.end(), uint32_t(bx)));
    members(b).push_back(uint32_t(bx));
    byload.insert({pk.load[size_t(a)], a});
    byload.insert({pk.load[size_t(b)], b});
  }
}


// The one-level plan (LPT over all `ranks`, then swaps for sparse); inputs already validated.
Plan flat_plan(std::span<const Segment> segs, int ranks, int micro_batches_per_rank, int64_t capacity, Batching batching,
               const LatencyModel& lm, int k0, const PlanOptions& opt, std::span<const double> preload = {}) {
  if (batching == Batching::Sequential) return sequential_plan(segs, ranks, capacity);

  std::vector<Item> order = lpt_order(segs, capacity, batching, lm, k0);
  std::vector<double> cost;
  if (batching == Batching::Sparse) {
    cost.resize(segs.size());
    for (const auto& it : order) cost[it.idx] = it.cost;
  }
  Packer pk(ranks, micro_batches_per_rank, capacity, segs.size());
  if (!preload.empty()) pk.load.assign(preload.begin(), preload.end());
  // Min-heap of (load, rank) over ranks that may have room. A rank without room for the current
  // segment waits in `aside` (max-heap by its largest free space) until a segment fits it again:
  // each rank is set aside at most once per placement it receives, so LPT stays O(n log R).
  RankHeap heap;
  heap.h.reserve(size_t(ranks));
  if (preload.empty())
    for (int r = 0; r < ranks; ++r) heap.h.push_back({0.0, r});  // already a heap (equal loads, ranks ascending)
  else
    for (int r = 0; r < ranks; ++r) heap.push(pk.load[size_t(r)], r);
  std::priority_queue<std::tuple<int64_t, int, int>> aside;  // (max_free, rank, version)
  std::vector<int> version(size_t(ranks), 0);
  for (const Item& item : order) {
    const uint32_t i = item.idx;
    const int64_t len = item.len;
    while (!aside.empty() && std::get<0>(aside.top()) >= len) {
      auto [f, r, v] = aside.top();
      aside.pop();
      if (v == version[size_t(r)]) heap.push(pk.load[size_t(r)], r);
    }
    int r = -1;
    while (!heap.empty()) {
      int top = heap.top();
      if (pk.max_free[size_t(top)] >= len) { r = top; break; }
      aside.push({pk.max_free[size_t(top)], top, version[size_t(top)]});
      heap.pop();
    }
    if (r >= 0) {
      pk.put(i, r, pk.best_fit(r, len), len, item.cost);
      heap.update_top(pk.load[size_t(r)]);
    } else {  // no room anywhere: an extra micro-batch on the least-loaded rank (ties: lower rank)
      r = 0;
      for (int q = 1; q < ranks; ++q)
        if (pk.load[size_t(q)] < pk.load[size_t(r)]) r = q;
      int m = pk.add_mb(r);
      ++version[size_t(r)];  // its entry in `aside` is now stale
      pk.put(i, r, m, len, item.cost);
      heap.push(pk.load[size_t(r)], r);
    }
  }
  if (batching == Batching::Sparse) improve(pk, segs, cost, opt.swap_rounds);

  // Materialise: micro-batches keep segments in data order; empty micro-batches are dropped.
  // A counting sort of segment indices by destination, then one exact-size fill per micro-batch:
  // no growth reallocations and no random read-modify-write of micro-batch headers.
  std::vector<uint32_t> base(size_t(ranks) + 1, 0);
  for (int r = 0; r < ranks; ++r) base[size_t(r) + 1] = base[size_t(r)] + uint32_t(pk.n_mb(r));
  std::vector<uint32_t> off(size_t(base.back()) + 1, 0);
  for (size_t i = 0; i < segs.size(); ++i) ++off[base[size_t(pk.where_rank[i])] + uint32_t(pk.where_mb[i]) + 1];
  for (size_t j = 0; j < base.back(); ++j) off[j + 1] += off[j];
  std::vector<uint32_t> perm(segs.size());
  {
    std::vector<uint32_t> pos(off.begin(), off.end() - 1);
    for (size_t i = 0; i < segs.size(); ++i) perm[pos[base[size_t(pk.where_rank[i])] + uint32_t(pk.where_mb[i])]++] = uint32_t(i);
  }
  Plan p;
  p.ranks.resize(size_t(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& out = p.ranks[size_t(r)];
    int used = 0;
    for (uint32_t j = base[size_t(r)]; j < base[size_t(r) + 1]; ++j) used += off[j + 1] > off[j];
    out.resize(size_t(used));
    int k = 0;
    for (uint32_t j = base[size_t(r)]; j < base[size_t(r) + 1]; ++j) {
      if (off[j + 1] == off[j]) continue;
      MicroBatch& mb = out[size_t(k++)];
      mb.segs.reserve(off[j + 1] - off[j]);
      for (uint32_t q = off[j]; q < off[j + 1]; ++q) mb.segs.push_back(segs[perm[q]]), mb.tokens += int64_t(segs[perm[q]].len);
    }
  }
  return p;
}

[[noreturn]] void too_long(const Segment& s, int64_t capacity) {
  throw Error("make_plan: segment of document " + std::to_string(s.doc) + " has " + std::to_string(s.len) +
              " tokens, more than the capacity " + std::to_string(capacity) + " (train.micro_batch_tokens); window it first (make_segments)");
}

// Everything but the per-segment length check (a full pass; the two-level path folds it into its own).
void validate_sizes(size_t n, int ranks, int micro_batches_per_rank, const PlanOptions& opt) {
  if (ranks < 1) throw Error("make_plan: ranks = " + std::to_string(ranks) + " must be >= 1");
  if (micro_batches_per_rank < 1) throw Error("make_plan: micro-batches per rank = " + std::to_string(micro_batches_per_rank) + " must be >= 1");
  if (opt.group_ranks < 0) throw Error("make_plan: group_ranks = " + std::to_string(opt.group_ranks) + " must be >= 0 (0 = one group)");
  if (n >= size_t(UINT32_MAX)) throw Error("make_plan: " + std::to_string(n) + " segments in one global batch (at most 2^32 - 1)");
}

void validate_lengths(std::span<const Segment> segs, int64_t capacity) {
  for (const auto& s : segs)
    if (int64_t(s.len) > capacity) too_long(s, capacity);
}

bool two_level(int ranks, Batching batching, const PlanOptions& opt) {
  return batching != Batching::Sequential && opt.group_ranks > 0 && opt.group_ranks < ranks;
}

// Two-level plan, level 1: cut the data-order segments into one contiguous run per group of
// `group_ranks` ranks (the last group may be smaller), each run's predicted cost proportional to its
// group's rank count. A segment goes to the run where the midpoint of its cumulative cost falls.
// One pass builds a length histogram (and checks the lengths), so the cost is computed once per
// distinct length; a second pass places the cuts, and stops after group `last`'s end. Returns G + 1
// boundaries, valid up to index last + 1.
std::vector<size_t> group_runs(std::span<const Segment> segs, int ranks, int64_t cap, Batching b, const LatencyModel& lm, int k0,
                               int g, int last) {
  const int G = (ranks + g - 1) / g;
  std::vector<uint32_t> hist(size_t(cap) + 1, 0);
  for (const auto& s : segs) {
    if (int64_t(s.len) > cap) too_long(s, cap);
    ++hist[size_t(s.len)];
  }
  std::vector<double> cost(size_t(cap) + 1, 0.0);
  double total = 0;
  for (size_t len = 1; len <= size_t(cap); ++len)
    if (hist[len]) {
      cost[len] = b == Batching::Tokens ? double(len) : b == Batching::Quadratic ? lm.dense_segment_cost(int64_t(len)) : lm.segment_cost(int64_t(len), k0);
      total += double(hist[len]) * cost[len];
    }
  std::vector<size_t> bounds(size_t(G) + 1, segs.size());
  bounds[0] = 0;
  int q = 0;
  double acc = 0, next = total * double(std::min(ranks, g)) / ranks;
  for (size_t i = 0; i < segs.size() && q <= last; ++i) {
    double c = cost[size_t(segs[i].len)];
    while (q < G - 1 && acc + c / 2 >= next) bounds[size_t(++q)] = i, next = total * double(std::min(ranks, (q + 1) * g)) / ranks;
    acc += c;
  }
  return bounds;
}

}  // namespace

Plan make_plan(std::span<const Segment> segs, int ranks, int micro_batches_per_rank, int64_t capacity, Batching batching,
               const LatencyModel& lm, int k0, const PlanOptions& opt, std::span<const double> preload) {
  validate_sizes(segs.size(), ranks, micro_batches_per_rank, opt);
  if (!preload.empty() && int64_t(preload.size()) != ranks)
    throw Error("make_plan: " + std::to_string(preload.size()) + " preloads for " + std::to_string(ranks) + " ranks");
  if (!two_level(ranks, batching, opt)) {
    validate_lengths(segs, capacity);
    return flat_plan(segs, ranks, micro_batches_per_rank, capacity, batching, lm, k0, opt, preload);
  }
  const int g = opt.group_ranks;
  auto bounds = group_runs(segs, ranks, capacity, batching, lm, k0, g, (ranks + g - 1) / g - 1);
  Plan p;
  p.ranks.resize(size_t(ranks));
  for (size_t q = 0; q + 1 < bounds.size(); ++q) {
    const int first = int(q) * g, n = std::min(ranks, first + g) - first;
    Plan gp = flat_plan(segs.subspan(bounds[q], bounds[q + 1] - bounds[q]), n, micro_batches_per_rank, capacity, batching, lm, k0, opt);
    for (int r = 0; r < n; ++r) p.ranks[size_t(first + r)] = std::move(gp.ranks[size_t(r)]);
  }
  return p;
}

GroupPlan make_group_plan(std::span<const Segment> segs, int ranks, int micro_batches_per_rank, int64_t capacity, Batching batching,
                          const LatencyModel& lm, int k0, const PlanOptions& opt, int rank) {
  validate_sizes(segs.size(), ranks, micro_batches_per_rank, opt);
  if (rank < 0 || rank >= ranks) throw Error("make_group_plan: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(ranks) + ")");
  GroupPlan out;
  if (!two_level(ranks, batching, opt)) {  // one group: the whole plan
    validate_lengths(segs, capacity);
    out.ranks = flat_plan(segs, ranks, micro_batches_per_rank, capacity, batching, lm, k0, opt).ranks;
    return out;
  }
  const int g = opt.group_ranks;
  const size_t q = size_t(rank / g);
  auto bounds = group_runs(segs, ranks, capacity, batching, lm, k0, g, int(q));
  out.first_rank = int(q) * g;
  const int n = std::min(ranks, out.first_rank + g) - out.first_rank;
  out.ranks = flat_plan(segs.subspan(bounds[q], bounds[q + 1] - bounds[q]), n, micro_batches_per_rank, capacity, batching, lm, k0, opt).ranks;
  return out;
}

}  // namespace sb
