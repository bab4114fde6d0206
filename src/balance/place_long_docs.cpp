// Documents in parts (data.long_docs = "split"): which documents leave the batch to be trained by a
// group of ranks, over how many, onto which ranks, and what each member's part costs (plan.hpp
// declares them beside the plan they feed: make_plan's `preload` is the load placed here).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <queue>
#include <string>

#include "base/error.hpp"
#include "src/balance/plan.hpp"
#include "src/balance/window_max.hpp"

namespace sb {

double part_exchange_ms(const LatencyModel& lm, int64_t len, int G, double kv_bytes_per_token) {
  // 6 collectives per layer, each member receiving the (G - 1) / G of len x kv bytes it does not hold;
  // an all-reduce of B bytes moves about what two such all-gathers of B do.
  if (G < 2) return 0;
  return lm.shape().n_layers * 3.0 * lm.allreduce_ms(double(len) * kv_bytes_per_token * (G - 1) / G);
}

double part_gating_ms(const LatencyModel& lm, int64_t len) {
  if (lm.part_gating() == PartGating::OwnRows) return lm.sparse_layers() * lm.part_ms(Part::Gating, 0, 0);
  return lm.sparse_layers() * lm.part_ms(Part::Gating, double(len), LatencyModel::causal_blocks(len, lm.shape().block_size));
}

namespace {
// A whole document's cost in `batching`'s units.
double whole_cost(Batching batching, const LatencyModel& lm, int64_t len, int k0) {
  if (batching == Batching::Tokens || batching == Batching::Sequential) return double(len);
  return batching == Batching::Quadratic ? lm.dense_segment_cost(len) : lm.segment_cost(len, k0);
}
}  // namespace

double split_cost(Batching batching, const LatencyModel& lm, int64_t len, int G, int k0, double kv_bytes_per_token) {
  const double W = whole_cost(batching, lm, len, k0);
  if (batching == Batching::Tokens || batching == Batching::Sequential) return W / G;
  // Each member gates its own rows (PartGating::OwnRows): the gating splits with the work, each
  // member paying its per-layer constant; or the whole document (Whole): its gating is not split.
  const double gate = std::min(W, part_gating_ms(lm, len));
  const double split = lm.part_gating() == PartGating::OwnRows ? W : W - gate;
  return split / G + gate + part_exchange_ms(lm, len, G, kv_bytes_per_token);
}

std::vector<PartGroup> place_long_docs(std::vector<std::pair<uint64_t, uint64_t>>& docs, int64_t capacity, int ranks,
                                        Batching batching, const LatencyModel& lm, int k0, double kv_bytes_per_token,
                                        bool split_fitting, std::vector<double>& load, double fitting_part) {
  if (!(fitting_part > 0 && fitting_part <= 1))
    throw Error("place_long_docs: part " + std::to_string(fitting_part) + " of the fair share must be in (0, 1] (balance.part_share)");
  std::vector<PartGroup> out;
  double total = 0;
  std::vector<double> wc(docs.size());  // [doc] whole cost, compacted with docs below
  for (size_t i = 0; i < docs.size(); ++i) total += wc[i] = whole_cost(batching, lm, int64_t(docs[i].second), k0);
  const double fair = total / ranks;
  const double part = split_fitting ? fitting_part * fair : fair;  // what one part of a fitting document may cost
  // Enough members that one's part, exchange and whole-document gating included, is within `cap`
  // (at most all ranks). The part's cost falls with G but for its fixed terms (gating, the exchange's
  // (G - 1) / G): from the least G those allow, up while it is too costly.
  const bool in_ms = batching == Batching::Quadratic || batching == Batching::Sparse;
  auto members = [&](int64_t len, double W, double cap) {
    const double gate = in_ms ? std::min(W, part_gating_ms(lm, len)) : 0;                      // every member's
    const double split = lm.part_gating() == PartGating::OwnRows ? W : W - gate;           // split_cost's
    const double x_max = in_ms ? part_exchange_ms(lm, len, ranks, kv_bytes_per_token) : 0;  // X(G) <= X(ranks)
    int64_t g = cap > gate ? int64_t(std::ceil(split / (cap - gate) - 1e-9)) : int64_t(ranks);
    const int64_t hi = cap > gate + x_max ? int64_t(std::ceil(split / (cap - gate - x_max) - 1e-9)) : int64_t(ranks);
    g = std::clamp<int64_t>(g, 1, ranks);
    while (g < std::min<int64_t>(hi, ranks) && split_cost(batching, lm, len, int(g), k0, kv_bytes_per_token) > cap) ++g;
    return g;
  };
  size_t kept = 0;
  for (size_t j = 0; j < docs.size(); ++j) {
    const auto [doc, len] = docs[j];
    const double W = wc[j];
    const bool long_doc = int64_t(len) > capacity;
    if (!long_doc && !(split_fitting && W > part)) {
      wc[kept] = W, docs[kept++] = {doc, len};
      continue;
    }
    // A long document's parts stay within the fair share (finer parts cost more exchange, and its
    // members are few beside the ranks); a fitting one's within `part`, small pieces that fill the
    // gaps LPT leaves.
    int64_t G = (int64_t(len) + capacity - 1) / capacity;
    if (G <= ranks) G = std::max(G, members(int64_t(len), W, long_doc ? fair : part));
    if (G < 2 && !long_doc) {  // a fitting document not worth splitting after all
      wc[kept] = W, docs[kept++] = {doc, len};
      continue;
    }
    if (G > ranks)
      throw Error("document " + std::to_string(doc) + " has " + std::to_string(len) + " tokens: split at most " +
                  std::to_string(capacity) + " tokens per rank (train.micro_batch_tokens) it needs " +
                  std::to_string(G) + " ranks, and the run has " + std::to_string(ranks) +
                  " (data.long_docs = \"split\"); run on " + std::to_string(G) +
                  " ranks or more, or raise train.micro_batch_tokens");
    out.push_back({doc, len, 0, int(G)});
  }
  // The groups' gating copies and exchange raise every rank's mean load above the fair share of
  // whole costs: a share of that mean is what a part may cost, so groups sized on the plain share
  // have members (each one more copy of the gating and more exchange) that the step cannot use.
  if (in_ms && !out.empty()) {
    double over = 0;
    for (const PartGroup& g : out)
      over += split_cost(batching, lm, int64_t(g.len), g.ranks, k0, kv_bytes_per_token) * g.ranks - whole_cost(batching, lm, int64_t(g.len), k0);
    const double fair2 = fair + over / ranks;
    for (PartGroup& g : out) {
      const int64_t len = int64_t(g.len), least = std::max<int64_t>(len > capacity ? (len + capacity - 1) / capacity : 2, 1);
      const double cap = len > capacity ? fair2 : fair2 * (split_fitting ? fitting_part : 1.0);
      g.ranks = int(std::min<int64_t>(g.ranks, std::max(least, members(len, whole_cost(batching, lm, len, k0), cap))));
    }
  }
  docs.resize(kept);
  load.resize(size_t(ranks), 0.0);
  std::vector<double> cost(out.size());
  for (size_t i = 0; i < out.size(); ++i)
    cost[i] = split_cost(batching, lm, int64_t(out[i].len), out[i].ranks, k0, kv_bytes_per_token);
  // Costliest group first (ties: data order), sorted on a contiguous (key, index) array.
  std::vector<std::pair<double, size_t>> keyed(out.size());
  for (size_t i = 0; i < out.size(); ++i) keyed[i] = {-cost[i] * out[i].ranks, i};
  std::sort(keyed.begin(), keyed.end());
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = keyed[i].second;
  std::vector<PartGroup> placed;
  std::map<int, WindowMax> windows;     // one per group size in use
  std::vector<std::pair<int, int>> log;  // (first rank, ranks) of the groups placed so far
  auto window = [&](int G) -> WindowMax& {
    auto it = windows.find(G);
    if (it == windows.end()) it = windows.emplace(G, WindowMax(load, G, log.size())).first;
    return it->second;
  };
  // With fine parts (fitting_part < 1) a group whose best window would end above the step's mean
  // load takes up to kGrow more members while that lowers its window's top: the last groups then
  // fill the least loaded ranks instead of stacking on them (one micro-batch per rank, bench/results/2026-12-01-parts-beside-big-docs.md).
  constexpr int kGrow = 4;
  double mean = total;  // the step's mean load with the groups' exchange
  for (size_t i = 0; i < out.size(); ++i) mean += cost[i] * out[i].ranks - whole_cost(batching, lm, int64_t(out[i].len), k0);
  mean /= ranks;
  // A whole document costing more than kBig x the mean load fits beside a part only if the part is
  // small, and beside few others: it needs (nearly) a rank of its own. Such documents (many at one
  // micro-batch per rank, none at four) are set down first, LPT onto the least loaded ranks (from
  // rank 0), while the groups are placed, then lifted (make_plan's LPT places them, onto the ranks
  // the groups left them), so that the groups leave them room; the last groups, finding no free
  // window, grow (as above) onto the least loaded ranks instead of leaving a big document no gap
  // that fits it. Plain part at 64 ranks x 1 micro-batch was 1.085x the token-level bound with
  // DST (a rank with a 34K-token part and a 40K-token document), 1.024x with this; 0.5 left the
  // documents just under it (27K tokens) no gap; 0.25-0.33 gave the same (bench/results/2026-12-01-parts-beside-big-docs.md).
  constexpr double kBig = 0.4;
  std::vector<double> big;
  for (size_t i = 0; i < kept; ++i)
    if (wc[i] > kBig * mean) big.push_back(wc[i]);
  std::sort(big.begin(), big.end(), std::greater<>());
  const std::vector<double> start = load;  // the load to return: the groups' costs on it
  {
    std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>> q;  // (load, rank)
    for (int r = 0; r < ranks && !big.empty(); ++r) q.push({load[size_t(r)], r});
    for (double c : big) {
      const int r = q.top().second;
      q.pop();
      load[size_t(r)] += c;
      q.push({load[size_t(r)], r});
    }
  }
  const int grow = (split_fitting && fitting_part < 1) || !big.empty() ? kGrow : 0;
  std::vector<double> placed_cost;
  for (size_t i : order) {
    PartGroup g = out[i];
    double c = cost[i];
    WindowMax& w = window(g.ranks);
    g.first = w.best(load, log);  // the window whose busiest rank is least busy (ties: lowest first)
    double top = w.best_max() + c;
    for (int G = g.ranks + 1; G <= std::min(ranks, out[i].ranks + grow) && top > mean; ++G) {
      const double cG = split_cost(batching, lm, int64_t(g.len), G, k0, kv_bytes_per_token);
      WindowMax& wG = window(G);
      const int fG = wG.best(load, log);
      if (wG.best_max() + cG < top) top = wG.best_max() + cG, g.ranks = G, g.first = fG, c = cG;
    }
    for (int r = g.first; r < g.first + g.ranks; ++r) load[size_t(r)] += c;
    log.push_back({g.first, g.ranks});
    placed.push_back(g), placed_cost.push_back(c);
  }
  if (!big.empty()) {  // lift the big documents: the load is the groups' alone
    load = start;
    for (size_t i = 0; i < placed.size(); ++i)
      for (int r = placed[i].first; r < placed[i].first + placed[i].ranks; ++r) load[size_t(r)] += placed_cost[i];
  }
  return placed;
}

}  // namespace sb
