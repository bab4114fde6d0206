// The original (pre-optimisation) DST greedy, curve summaries and T* bisection, kept verbatim as a
// reference: the fast summarize / target_time / tune_rank must give exactly the same curves, T*
// and budgets on every input. Test-only.
#pragma once
#include <algorithm>
#include <cmath>
#include <queue>

#include "src/balance/dst_exchange.hpp"
#include "base/error.hpp"

namespace sb::ref {
namespace {

// The greedy state of one rank: a budget step per item (item = mb * n_layers + layer).
struct State {
  std::vector<int> step;
  double ms = 0, rec = 0;
};

State initial(const DstItems& it) {
  State s;
  s.step.assign(size_t(it.n_mb * it.n_layers), it.i0);
  for (int m = 0; m < it.n_mb; ++m) {
    s.ms += it.fixed_ms[size_t(m)] + it.n_layers * it.attn_ms[size_t(m * it.n_steps + it.i0)];
    for (int l = 0; l < it.n_layers; ++l) s.rec += it.rec[size_t((m * it.n_layers + l) * it.n_steps + it.i0)];
  }
  return s;
}

// A candidate move of one item to step `to`: dt > 0 ms changed, dr >= 0 recall changed.
struct Move {
  double ratio;
  int item, to;
  double dt, dr;
};

// Next step down (up) whose time differs: budgets above a segment's causal blocks change nothing.
bool next_move(const DstItems& it, const State& s, int item, bool down, Move& mv) {
  int m = item / it.n_layers, S = it.n_steps, cur = s.step[size_t(item)];
  const double* t = &it.attn_ms[size_t(m * S)];
  const double* r = &it.rec[size_t(item * S)];
  int to = cur;
  do to += down ? -1 : 1;
  while (to >= 0 && to < S && t[to] == t[cur]);
  if (to < 0 || to >= S) return false;
  mv.item = item, mv.to = to;
  mv.dt = std::abs(t[cur] - t[to]), mv.dr = std::abs(r[cur] - r[to]);
  if (!(mv.dt > 0) || (!down && !(mv.dr > 0))) return false;  // raising without recall gain is waste
  mv.ratio = mv.dr / mv.dt;
  return true;
}

void apply(const DstItems& it, State& s, const Move& mv) {
  int m = mv.item / it.n_layers, S = it.n_steps, cur = s.step[size_t(mv.item)];
  s.ms += it.attn_ms[size_t(m * S + mv.to)] - it.attn_ms[size_t(m * S + cur)];
  s.rec += it.rec[size_t(mv.item * S + mv.to)] - it.rec[size_t(mv.item * S + cur)];
  s.step[size_t(mv.item)] = mv.to;
}

// Lower budgets (smallest recall lost per ms saved first) until ms <= T or all at the bound;
// or raise (largest recall gained per ms first) while staying <= T. Ties: lower item index.
// `path` (optional) records (ms, rec) after every applied move.
void greedy(const DstItems& it, State& s, double T, bool down, std::vector<std::pair<double, double>>* path) {
  auto worse = [down](const Move& a, const Move& b) {  // priority_queue: top = best
    if (a.ratio != b.ratio) return down ? a.ratio > b.ratio : a.ratio < b.ratio;
    return a.item > b.item;
  };
  std::priority_queue<Move, std::vector<Move>, decltype(worse)> pq(worse);
  // T* is a statistic of sums of the same numbers: allow rounding, so perfect balance moves nothing.
  const double tol = 1e-9 * std::max(1.0, std::abs(T));
  Move mv;
  for (int i = 0; i < it.n_mb * it.n_layers; ++i)
    if (next_move(it, s, i, down, mv)) pq.push(mv);
  while (!pq.empty()) {
    if (down && s.ms <= T + tol) break;
    mv = pq.top();
    pq.pop();
    if (!down && s.ms + mv.dt > T + tol) continue;  // would pass T*: this item stays where it is
    apply(it, s, mv);
    if (path) path->push_back({s.ms, s.rec});
    if (next_move(it, s, mv.item, down, mv)) pq.push(mv);
  }
}

// `n` samples of a path starting at `start` (first and last point always kept; padded to n).
void sample_path(const std::vector<std::pair<double, double>>& path, std::pair<double, double> start, int n,
                 std::vector<double>& ms, std::vector<double>& rec) {
  ms.assign(size_t(n), 0), rec.assign(size_t(n), 0);
  size_t P = path.size() + 1;
  for (int j = 0; j < n; ++j) {
    size_t idx = n == 1 ? P - 1 : size_t(std::llround(double(j) * double(P - 1) / double(n - 1)));
    auto pt = idx == 0 ? start : path[idx - 1];
    ms[size_t(j)] = pt.first, rec[size_t(j)] = pt.second;
  }
}

int curve_points(const DstParams& p) { return p.target == Target::Recall ? std::max(2, p.curve_points) : 0; }

// Recall sum a rank reaches when tuned toward T, from its sampled curves: a lower bound of what
// its exact greedy reaches (lowering: the first sampled prefix at or under T; raising: the last
// sampled prefix at or under T, and the exact greedy only adds to that prefix).
double recall_at(const RankSummary& r, double T) {
  if (r.n_mb == 0) return 0;
  if (T >= r.ms_k0) {
    auto it = std::upper_bound(r.hi_ms.begin(), r.hi_ms.end(), T);
    return it == r.hi_ms.begin() ? r.recall_k0 : r.hi_rec[size_t(it - r.hi_ms.begin() - 1)];
  }
  size_t lo = 0, hi = r.lo_ms.size();  // first j with lo_ms[j] <= T
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (r.lo_ms[mid] <= T) hi = mid; else lo = mid + 1;
  }
  return lo < r.lo_ms.size() ? r.lo_rec[lo] : r.lo_rec.back();
}

RankSummary summarize(const DstItems& it, const DstParams& p) {
  RankSummary r;
  r.n_mb = it.n_mb;
  State s0 = initial(it);
  r.ms_k0 = s0.ms, r.recall_k0 = s0.rec;
  for (double w : it.weight) r.weight += w;
  r.ms_lo = r.ms_hi = s0.ms;
  for (int m = 0; m < it.n_mb; ++m) {
    r.ms_lo += it.n_layers * (it.attn_ms[size_t(m * it.n_steps)] - it.attn_ms[size_t(m * it.n_steps + it.i0)]);
    r.ms_hi += it.n_layers * (it.attn_ms[size_t(m * it.n_steps + it.n_steps - 1)] - it.attn_ms[size_t(m * it.n_steps + it.i0)]);
  }
  int G = curve_points(p);
  if (G > 0) {
    std::vector<std::pair<double, double>> path;
    State s = s0;
    greedy(it, s, -1e300, true, &path);
    sample_path(path, {s0.ms, s0.rec}, G, r.lo_ms, r.lo_rec);
    path.clear(), s = s0;
    greedy(it, s, 1e300, false, &path);
    sample_path(path, {s0.ms, s0.rec}, G, r.hi_ms, r.hi_rec);
  }
  return r;
}

double target_time(std::span<const RankSummary> ranks, const DstParams& p) {
  double sum = 0, mn = 1e300, mx = 0, lo = 1e300;
  int busy = 0;
  for (const auto& r : ranks) {
    if (r.n_mb == 0) continue;  // an idle rank cannot take work: it does not set the target
    ++busy, sum += r.ms_k0, mn = std::min(mn, r.ms_k0), mx = std::max(mx, r.ms_k0), lo = std::min(lo, r.ms_lo);
  }
  if (busy == 0) return 0;
  switch (p.target) {
    case Target::Mean: return sum / busy;
    case Target::Min: return mn;
    case Target::Max: return mx;
    case Target::Recall: break;
  }
  for (const auto& r : ranks)
    if (r.n_mb > 0 && r.lo_ms.empty()) throw Error("dst: balance.target = recall needs the recall curves in the exchange");
  double base = 0;
  for (const auto& r : ranks) base += r.recall_k0;
  auto enough = [&](double T) {
    double s = 0;
    for (const auto& r : ranks) s += recall_at(r, T);  // same order as `base`: monotone rounding
    return s >= base;
  };
  double a = lo, b = mx;  // enough(b) holds: every rank at or above its k0 recall
  if (enough(a)) return a;
  for (int i = 0; i < 60 && b - a > 1e-9 * b; ++i) {
    double mid = 0.5 * (a + b);
    (enough(mid) ? b : a) = mid;
  }
  return b;
}

TuneResult tune_rank(const DstItems& it, double target_ms, const DstParams& p) {
  TuneResult res;
  res.target_ms = target_ms;
  State s = initial(it);
  if (p.tuning == Tuning::Dst && it.n_mb > 0) greedy(it, s, target_ms, s.ms > target_ms * (1 + 1e-9), nullptr);
  res.k.assign(size_t(it.n_mb), std::vector<int>(size_t(it.n_layers)));
  for (int m = 0; m < it.n_mb; ++m)
    for (int l = 0; l < it.n_layers; ++l) res.k[size_t(m)][size_t(l)] = it.ks[size_t(s.step[size_t(m * it.n_layers + l)])];
  res.my_predicted_ms = s.ms;
  for (double w : it.weight) res.my_weight += w;
  res.my_recall = res.my_weight > 0 ? s.rec / res.my_weight : 1.0;
  return res;
}

}  // namespace
}  // namespace sb::ref
