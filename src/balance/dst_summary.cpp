#include "src/balance/dst_summary.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"
#include "src/balance/dst_tune.hpp"

namespace sb {

namespace {

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

// Whether recall_at(r, T) is non-decreasing in T: the lowering path descends from (ms_k0,
// recall_k0) in both time and recall, the raising path ascends in both (as summarize() makes them
// when time and recall grow with the budget), nothing is NaN.
bool monotone_curves(const RankSummary& r) {
  const size_t G = r.lo_ms.size();
  if (G == 0 || r.lo_rec.size() != G || r.hi_ms.size() != G || r.hi_rec.size() != G) return false;
  bool ok = r.ms_k0 == r.ms_k0 && r.lo_rec[0] <= r.recall_k0 && r.recall_k0 <= r.hi_rec[0] && r.lo_ms[0] == r.lo_ms[0] &&
            r.hi_ms[0] == r.hi_ms[0];
  for (size_t j = 1; j < G; ++j)
    ok &= (r.lo_ms[j] <= r.lo_ms[j - 1]) & (r.lo_rec[j] <= r.lo_rec[j - 1]) & (r.hi_ms[j - 1] <= r.hi_ms[j]) &
          (r.hi_rec[j - 1] <= r.hi_rec[j]);
  return ok;
}

}  // namespace

RankSummary summarize(const DstItems& it, const DstParams& p) {
  RankSummary r;
  r.n_mb = it.n_mb;
  dst::State s0 = dst::initial(it);
  r.ms_k0 = s0.ms, r.recall_k0 = s0.rec;
  for (double w : it.weight) r.weight += w;
  r.ms_lo = r.ms_hi = s0.ms;
  for (int m = 0; m < it.n_mb; ++m) {
    r.ms_lo += it.n_tuned() * (it.attn_ms[size_t(m * it.n_steps)] - it.attn_ms[size_t(m * it.n_steps + it.i0)]);
    r.ms_hi += it.n_tuned() * (it.attn_ms[size_t(m * it.n_steps + it.n_steps - 1)] - it.attn_ms[size_t(m * it.n_steps + it.i0)]);
  }
  int G = curve_points(p);
  if (G > 0) {
    std::vector<std::pair<double, double>> path;
    dst::State s = s0;
    dst::greedy(it, s, -1e300, true, &path);
    sample_path(path, {s0.ms, s0.rec}, G, r.lo_ms, r.lo_rec);
    path.clear(), s = s0;
    dst::greedy(it, s, 1e300, false, &path);
    sample_path(path, {s0.ms, s0.rec}, G, r.hi_ms, r.hi_rec);
    r.monotone = monotone_curves(r);
  }
  return r;
}

size_t packed_size(const DstParams& p) { return 8 + 4 * size_t(curve_points(p)); }

std::vector<double> pack(const RankSummary& s, const DstParams& p) {
  int G = curve_points(p);
  std::vector<double> v = {double(s.n_mb), s.ms_k0, s.recall_k0, s.weight, s.ms_lo, s.ms_hi, double(G), 0};
  for (const auto* a : {&s.lo_ms, &s.lo_rec, &s.hi_ms, &s.hi_rec}) {
    if (int(a->size()) != G) throw Error("dst: rank summary curve has " + std::to_string(a->size()) + " points, expected " + std::to_string(G));
    v.insert(v.end(), a->begin(), a->end());
  }
  return v;
}

void unpack(std::span<const double> d, RankSummary& s) {
  if (d.size() < 8) throw Error("dst: truncated rank summary in the exchange");
  const size_t G = size_t(d[6]);
  if (d.size() != 8 + 4 * G) throw Error("dst: rank summary of " + std::to_string(d.size()) + " values, expected " + std::to_string(8 + 4 * G));
  s.n_mb = int(d[0]), s.ms_k0 = d[1], s.recall_k0 = d[2], s.weight = d[3], s.ms_lo = d[4], s.ms_hi = d[5];
  const double* x = d.data() + 8;
  for (auto* a : {&s.lo_ms, &s.lo_rec, &s.hi_ms, &s.hi_rec}) a->assign(x, x + G), x += G;
  s.monotone = G > 0 && monotone_curves(s);
}

RankSummary unpack(std::span<const double> d) {
  RankSummary s;
  unpack(d, s);
  return s;
}

}  // namespace sb
