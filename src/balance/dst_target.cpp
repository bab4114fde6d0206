#include "src/balance/dst_target.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.hpp"

namespace sb {

namespace {

// A value of a step function of T and an interval [lo, hi) of T over which it has that value.
struct Piece {
  double value = 0, lo = 1, hi = 0;  // default: empty, contains no T
  bool contains(double T) const { return T >= lo && T < hi; }
};

// Narrow p to the T' that compare with x as T does (neither branch: x or T is NaN, and the
// comparison comes out the same for every T').
void same_side(double x, double T, Piece& p) {
  if (x <= T) p.lo = std::max(p.lo, x);
  else if (T < x) p.hi = std::min(p.hi, x);
}

// Recall sum a rank reaches when tuned toward T, from its sampled curves: a lower bound of what
// its exact greedy reaches (lowering: the first sampled prefix at or under T; raising: the last
// sampled prefix at or under T, and the exact greedy only adds to that prefix). Returned with the
// interval of the T' for which every comparison made here comes out as for T, so that
// recall_at(r, T') is the same value, whatever the curves hold.
Piece recall_at(const RankSummary& r, double T) {
  Piece p{0, -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  if (r.n_mb == 0) return p;
  same_side(r.ms_k0, T, p);
  if (T >= r.ms_k0) {  // last hi_ms[j] <= T: std::upper_bound, written out with the same probes
    size_t first = 0, len = r.hi_ms.size();
    while (len > 0) {
      size_t half = len / 2, mid = first + half;
      same_side(r.hi_ms[mid], T, p);
      if (T < r.hi_ms[mid]) len = half;
      else first = mid + 1, len -= half + 1;
    }
    p.value = first == 0 ? r.recall_k0 : r.hi_rec[first - 1];
    return p;
  }
  size_t lo = 0, hi = r.lo_ms.size();  // first j with lo_ms[j] <= T
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    same_side(r.lo_ms[mid], T, p);
    if (r.lo_ms[mid] <= T) hi = mid; else lo = mid + 1;
  }
  p.value = lo < r.lo_ms.size() ? r.lo_rec[lo] : r.lo_rec.back();
  return p;
}

// The summed recall f(T) of all ranks (in rank order, as `base` in target_time), keeping each
// rank's piece: T* is bisected, T moves by ever smaller steps, and a rank's curve is searched again
// only when T leaves its piece. Also returns the piece of f: the T' where it has the same value.
class RecallSum {
 public:
  explicit RecallSum(std::span<const RankSummary> ranks) : ranks_(ranks), piece_(ranks.size()) {}
  Piece operator()(double T) {
    Piece f{0, -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Piece& p = piece_[i];
      if (!p.contains(T)) p = recall_at(ranks_[i], T);
      f.value += p.value;
      f.lo = std::max(f.lo, p.lo), f.hi = std::min(f.hi, p.hi);
    }
    return f;
  }

 private:
  std::span<const RankSummary> ranks_;
  std::vector<Piece> piece_;
};

// Before the bisection over [a, b], with monotone curves: evaluate f where the crossing of `base`
// is likely, until the bracket [below, yes) of what is known is empty (the crossing is then known
// exactly) or 12 probes are spent. Each probe costs a pass over the ranks plus a search of each
// rank whose piece changed since the last one (the searches dominate), so the probes jump straight
// at the crossing: secant steps from the mean time at k0 (where balanced ranks keep their recall),
// then regula falsi inside the bracket (Illinois: the side not moved twice in a row has its value
// halved toward base). They only add knowledge; the bisection's answer does not depend on them.
void probe(RecallSum& f, double base, double guess, double a, double b, double& below, double& yes) {
  auto inside = [&](double t) { return t > a && t < b && t >= below && t < yes; };
  double t = guess, slope = 0;
  double t_no = a, f_no = 0, t_yes = b, f_yes = 0;  // the last probes each side (`has_*`: seen)
  bool has_no = false, has_yes = false;
  int kept = 0;  // > 0: the `no` side kept that many times in a row; < 0: the `yes` side
  for (int n = 0; n < 12 && below < yes; ++n) {
    if (!inside(t)) t = 0.5 * (std::max(has_no ? t_no : a, below) + std::min(has_yes ? t_yes : b, yes));
    if (!inside(t)) return;
    Piece ft = f(t);
    bool e = ft.value >= base;
    if (e) yes = std::min(yes, ft.lo);
    else below = std::max(below, ft.hi);
    double t_prev = e ? t_yes : t_no, f_prev = e ? f_yes : f_no;
    bool had = e ? has_yes : has_no;
    if (had && t != t_prev) slope = (ft.value - f_prev) / (t - t_prev);
    (e ? t_yes : t_no) = t, (e ? f_yes : f_no) = ft.value, (e ? has_yes : has_no) = true;
    kept = e ? std::min(kept, 0) - 1 : std::max(kept, 0) + 1;
    if (has_no && has_yes) {  // regula falsi between the two sides
      double fn = kept <= -2 ? base - 0.5 * (base - f_no) : f_no;
      double fy = kept >= 2 ? base + 0.5 * (f_yes - base) : f_yes;
      t = t_no + (base - fn) * (t_yes - t_no) / (fy - fn);
    } else if (slope > 0) {  // secant from one side, at most 16x the last step further
      double step = (base - ft.value) / slope, last = std::abs(t - t_prev);
      t += std::clamp(step, -16 * last, 16 * last);
    } else {  // first probe, or no slope seen yet: a small step toward the crossing
      t += (e ? -1 : 1) * (b - a) / 4096;
    }
  }
}

}  // namespace

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
  // The bisection below asks f(T) >= base at ~30 points; the answers are evaluated exactly (same
  // values, same order of summation) or, with monotone curves, inferred: f is then non-decreasing,
  // so it is >= base at or above a point where it was (`yes`), and < base below a point where it
  // was not (`below`); and it is constant on the piece around each point evaluated. Either way the
  // bisection takes the same branches as when it evaluated every step: the same T*, to the bit.
  RecallSum f(ranks);
  const bool monotone = std::all_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.n_mb == 0 || r.monotone; });
  double below = -std::numeric_limits<double>::infinity(), yes = std::numeric_limits<double>::infinity();
  auto enough = [&](double T) {
    if (T < below || T >= yes) return T >= yes;
    Piece fT = f(T);
    bool e = fT.value >= base;
    if (monotone && e) yes = std::min(yes, fT.lo);
    if (monotone && !e) below = std::max(below, fT.hi);
    return e;
  };
  double a = lo, b = mx;  // enough(b) holds: every rank at or above its k0 recall
  if (monotone) probe(f, base, sum / busy, a, b, below, yes);
  if (enough(a)) return a;
  for (int i = 0; i < 60 && b - a > 1e-9 * b; ++i) {
    double mid = 0.5 * (a + b);
    (enough(mid) ? b : a) = mid;
  }
  return b;
}

}  // namespace sb
