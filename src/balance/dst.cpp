#include "src/balance/dst.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "src/common/error.hpp"

namespace sb {

Target parse_target(const std::string& s) {
  if (s == "mean") return Target::Mean;
  if (s == "min") return Target::Min;
  if (s == "max") return Target::Max;
  if (s == "recall") return Target::Recall;
  throw Error("balance.target = \"" + s + "\": expected one of mean, min, max, recall");
}
Tuning parse_tuning(const std::string& s) {
  if (s == "fixed") return Tuning::Fixed;
  if (s == "dst") return Tuning::Dst;
  throw Error("balance.tuning = \"" + s + "\": expected one of fixed, dst");
}
const char* target_name(Target t) {
  switch (t) {
    case Target::Mean: return "mean";
    case Target::Min: return "min";
    case Target::Max: return "max";
    case Target::Recall: return "recall";
  }
  return "?";
}
const char* tuning_name(Tuning t) { return t == Tuning::Fixed ? "fixed" : "dst"; }

std::vector<int> budget_steps(const DstParams& p, int* k0_index) {
  int lo = std::max(p.k_min, int(std::floor(p.k0 * (1 - p.max_change))));
  int hi = std::min(p.k_max, int(std::ceil(p.k0 * (1 + p.max_change))));
  lo = std::max(0, std::min(lo, p.k0)), hi = std::max(hi, p.k0);  // k0 is always allowed
  std::vector<int> ks;
  for (int k = lo; k <= hi; ++k) ks.push_back(k);
  if (k0_index) *k0_index = p.k0 - lo;
  return ks;
}

DstItems build_items(std::span<const MicroBatch> mbs, const LatencyModel& lm, const RecallModel& rm, const DstParams& p) {
  if (lm.shape().n_layers != p.n_layers || rm.n_layers() != p.n_layers)
    throw Error("dst: n_layers differs between the latency model (" + std::to_string(lm.shape().n_layers) +
                "), the recall model (" + std::to_string(rm.n_layers()) + ") and the tuning parameters (" +
                std::to_string(p.n_layers) + ")");
  DstItems it;
  it.ks = budget_steps(p, &it.i0);
  it.n_mb = int(mbs.size()), it.n_layers = p.n_layers, it.n_steps = int(it.ks.size());
  const int S = it.n_steps, L = it.n_layers;
  const auto& sh = lm.shape();
  double bs2 = double(sh.block_size) * sh.block_size;
  it.fixed_ms.assign(size_t(it.n_mb), 0), it.attn_ms.assign(size_t(it.n_mb * S), 0);
  it.rec.assign(size_t(it.n_mb) * L * S, 0), it.weight.assign(size_t(it.n_mb), 0);
  std::vector<double> kept(static_cast<size_t>(S));
  for (int m = 0; m < it.n_mb; ++m) {
    const auto& mb = mbs[size_t(m)];
    double tokens = double(mb.tokens), pairs = 0;
    std::fill(kept.begin(), kept.end(), 0.0);
    double* rec = &it.rec[size_t(m) * L * S];
    for (const auto& s : mb.segs) {
      int64_t len = int64_t(s.len), nb = (len + sh.block_size - 1) / sh.block_size;
      pairs += LatencyModel::causal_blocks(len, sh.block_size);
      for (int j = 0; j < S; ++j) kept[size_t(j)] += lm.kept_blocks(len, it.ks[size_t(j)]);
      if (nb <= sh.local_blocks + 2 + it.ks[0]) {  // dense at every allowed budget: recall 1
        for (int x = 0; x < L * S; ++x) rec[x] += double(len);
        continue;
      }
      for (int l = 0; l < L; ++l)
        for (int j = 0; j < S; ++j) rec[l * S + j] += rm.recall_tokens(l, len, it.ks[size_t(j)]);
    }
    it.fixed_ms[size_t(m)] = lm.part_ms(Part::Linear, tokens) + L * lm.part_ms(Part::Gating, tokens, pairs);
    for (int j = 0; j < S; ++j) it.attn_ms[size_t(m * S + j)] = lm.part_ms(Part::Attention, tokens, kept[size_t(j)] * bs2);
    it.weight[size_t(m)] = tokens * L;
  }
  return it;
}

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

// A candidate move of item `item` (micro-batch `mb`) to step `to`: dt > 0 ms changed, ratio = recall
// changed per ms; d_ms, d_rec the signed changes that applying it adds.
struct Move {
  double ratio, dt, d_ms, d_rec;
  int item, mb, to;
};

// Next step down (up) whose time differs: budgets above a segment's causal blocks change nothing.
bool next_move(const DstItems& it, const State& s, int item, int mb, bool down, Move& mv) {
  int S = it.n_steps, cur = s.step[size_t(item)];
  const double* t = &it.attn_ms[size_t(mb * S)];
  const double* r = &it.rec[size_t(item * S)];
  int to = cur;
  do to += down ? -1 : 1;
  while (to >= 0 && to < S && t[to] == t[cur]);
  if (to < 0 || to >= S) return false;
  mv.item = item, mv.mb = mb, mv.to = to;
  mv.d_ms = t[to] - t[cur], mv.d_rec = r[to] - r[cur];
  mv.dt = std::abs(mv.d_ms);
  double dr = std::abs(mv.d_rec);
  if (!(mv.dt > 0) || (!down && !(dr > 0))) return false;  // raising without recall gain is waste
  mv.ratio = dr / mv.dt;
  return true;
}

void apply(State& s, const Move& mv) {
  s.ms += mv.d_ms, s.rec += mv.d_rec;
  s.step[size_t(mv.item)] = mv.to;
}

// Every item's next move in a winner tree (a tournament): each inner node holds the better of its
// two children, so the best move is at the root and changing one item's move replays only its path
// to the root. Better: smaller ratio when lowering, larger when raising, ties to the lower item
// index. That is a strict total order, so the root is the move a binary heap ordered the same way
// would pop. The replay is the hot loop of the greedy: it compares integer keys without branches.
class MoveTree {
 public:
  MoveTree(int n_items, bool down) : down_(down), moves_(size_t(n_items)) {
    while (leaves_ < n_items) leaves_ *= 2;
    node_.assign(2 * size_t(leaves_), kNone);
  }
  // Set (mv = nullptr: clear) one item's move; after a batch with replay = false, call rebuild().
  void set(int item, const Move* mv, bool replay = true) {
    if (mv) moves_[size_t(item)] = *mv;
    size_t n = size_t(leaves_ + item);
    Entry w = node_[n] = mv ? Entry{key(mv->ratio), uint32_t(item)} : kNone;
    for (; replay && n > 1; n /= 2) node_[n / 2] = w = better(w, node_[n ^ 1]);
  }
  void rebuild() {
    for (size_t n = size_t(leaves_) - 1; n >= 1; --n) node_[n] = better(node_[2 * n], node_[2 * n + 1]);
  }
  int best() const { return node_[1].item == kNone.item ? -1 : int(node_[1].item); }  // -1: no move left
  const Move& move(int item) const { return moves_[size_t(item)]; }

 private:
  struct Entry {
    uint64_t key;   // smaller first
    uint32_t item;  // ties: smaller first
  };
  static constexpr Entry kNone{~uint64_t(0), ~uint32_t(0)};  // after every move
  // A ratio is >= +0 and not NaN, so its bits, read as an unsigned integer, order like its value:
  // as they are when lowering (smallest first), complemented when raising (largest first).
  uint64_t key(double ratio) const { return down_ ? std::bit_cast<uint64_t>(ratio) : ~std::bit_cast<uint64_t>(ratio); }
  static Entry better(Entry a, Entry b) {
    bool a_first = (a.key < b.key) | ((a.key == b.key) & (a.item < b.item));  // | and &: no branches
    return {a_first ? a.key : b.key, a_first ? a.item : b.item};
  }
  bool down_;
  int leaves_ = 1;
  std::vector<Move> moves_;  // [item] its current move
  std::vector<Entry> node_;  // [1, leaves_) inner nodes, [leaves_, 2 leaves_) leaves (one per item)
};

// Lower budgets (smallest recall lost per ms saved first) until ms <= T or all at the bound;
// or raise (largest recall gained per ms first) while staying <= T. Ties: lower item index.
// `path` (optional) records (ms, rec) after every applied move.
void greedy(const DstItems& it, State& s, double T, bool down, std::vector<std::pair<double, double>>* path) {
  const int n = it.n_mb * it.n_layers;
  MoveTree tree(n, down);
  // T* is a statistic of sums of the same numbers: allow rounding, so perfect balance moves nothing.
  const double tol = 1e-9 * std::max(1.0, std::abs(T));
  Move mv;
  for (int i = 0; i < n; ++i)
    if (next_move(it, s, i, i / it.n_layers, down, mv)) tree.set(i, &mv, false);
  tree.rebuild();
  for (int i; (i = tree.best()) >= 0;) {
    if (down && s.ms <= T + tol) break;
    mv = tree.move(i);
    if (!down && s.ms + mv.dt > T + tol) {  // would pass T*: this item stays where it is
      tree.set(i, nullptr);
      continue;
    }
    apply(s, mv);
    if (path) path->push_back({s.ms, s.rec});
    tree.set(i, next_move(it, s, i, mv.mb, down, mv) ? &mv : nullptr);
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

double estimate_ms(const RankSummary& r, double T, const DstParams& p) {
  if (r.n_mb == 0 || p.tuning == Tuning::Fixed) return r.ms_k0;
  return r.ms_k0 > T ? std::max(T, r.ms_lo) : std::max(r.ms_k0, std::min(T, r.ms_hi));
}

}  // namespace

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

TuneResult tune(const DstInput& in, int my_rank, const DstParams& p) {
  if (my_rank < 0 || my_rank >= int(in.ranks.size()))
    throw Error("dst: rank " + std::to_string(my_rank) + " out of range (" + std::to_string(in.ranks.size()) + " ranks)");
  double T = target_time(in.ranks, p);
  TuneResult res = tune_rank(in.mine, T, p);
  double sum0 = 0, max0 = 0, sum1 = 0, max1 = 0;
  res.rank_predicted_ms.resize(in.ranks.size());
  for (size_t r = 0; r < in.ranks.size(); ++r) {
    double t = estimate_ms(in.ranks[r], T, p);
    res.rank_predicted_ms[r] = t;
    sum0 += in.ranks[r].ms_k0, max0 = std::max(max0, in.ranks[r].ms_k0), sum1 += t, max1 = std::max(max1, t);
  }
  double R = double(in.ranks.size());
  res.planned_imbalance_before = sum0 > 0 ? max0 / (sum0 / R) : 1.0;
  res.planned_imbalance_after = sum1 > 0 ? max1 / (sum1 / R) : 1.0;
  return res;
}

TuneResult exchange_and_tune(const Comm& comm, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p, DstExchange& work) {
  DstInput& in = work.in;
  in.mine = build_items(mine, lm, rm, p);
  std::vector<double> packed = pack(summarize(in.mine, p), p);
  // Every summary has the same size, so ranks need not know each other's plans (two-level plans).
  const size_t n = packed_size(p);
  work.gathered.resize(n * size_t(comm.size()));
  MPI_CHECK(MPI_Allgather(packed.data(), int(n), MPI_DOUBLE, work.gathered.data(), int(n), MPI_DOUBLE, comm.raw()));
  in.ranks.resize(size_t(comm.size()));
  for (int r = 0; r < comm.size(); ++r)
    unpack(std::span<const double>(work.gathered.data() + n * size_t(r), n), in.ranks[size_t(r)]);
  return tune(in, comm.rank(), p);
}

TuneResult exchange_and_tune(const Comm& comm, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p) {
  DstExchange work;
  return exchange_and_tune(comm, mine, lm, rm, p, work);
}

}  // namespace sb
