#include "src/balance/dst_tune.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace sb {

namespace dst {

State initial(const DstItems& it) {
  State s;
  s.step.assign(size_t(it.n_mb * it.n_layers), it.i0);
  for (int m = 0; m < it.n_mb; ++m) {
    s.ms += it.fixed_ms[size_t(m)] + it.n_tuned() * it.attn_ms[size_t(m * it.n_steps + it.i0)];
    for (int l = 0; l < it.n_layers; ++l) s.rec += it.rec[size_t((m * it.n_layers + l) * it.n_steps + it.i0)];
  }
  return s;
}

namespace {

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

}  // namespace

// Lower budgets (smallest recall lost per ms saved first) until ms <= T or all at the bound;
// or raise (largest recall gained per ms first) while staying <= T. Ties: lower item index.
// `path` (optional) records (ms, rec) after every applied move.
void greedy(const DstItems& it, State& s, double T, bool down, std::vector<std::pair<double, double>>* path) {
  const int n = it.n_mb * it.n_layers;
  MoveTree tree(n, down);
  // T* is a statistic of sums of the same numbers: allow rounding, so perfect balance moves nothing.
  const double tol = 1e-9 * std::max(1.0, std::abs(T));
  Move mv;
  for (int i = 0; i < n; ++i)  // dense layers' items never move
    if (it.tuned(i % it.n_layers) && next_move(it, s, i, i / it.n_layers, down, mv)) tree.set(i, &mv, false);
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

}  // namespace dst

TuneResult tune_rank(const DstItems& it, double target_ms, const DstParams& p) {
  TuneResult res;
  res.target_ms = target_ms;
  dst::State s = dst::initial(it);
  if (p.tuning == Tuning::Dst && it.n_mb > 0) dst::greedy(it, s, target_ms, s.ms > target_ms * (1 + 1e-9), nullptr);
  res.k.assign(size_t(it.n_mb), std::vector<int>(size_t(it.n_layers)));
  for (int m = 0; m < it.n_mb; ++m)
    for (int l = 0; l < it.n_layers; ++l) res.k[size_t(m)][size_t(l)] = it.ks[size_t(s.step[size_t(m * it.n_layers + l)])];
  res.my_predicted_ms = s.ms;
  for (double w : it.weight) res.my_weight += w;
  res.my_recall = res.my_weight > 0 ? s.rec / res.my_weight : 1.0;
  return res;
}

}  // namespace sb
