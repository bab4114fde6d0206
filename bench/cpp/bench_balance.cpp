// Planning cost per step: make_plan over the whole cluster (every rank computes it), for each
// batching (0 sequential, 1 tokens, 2 quadratic, 3 sparse), and one rank's DST (items, summary, T*,
// greedy), at 64/512/4096 ranks x 16 micro-batches, longalign; the original planner and DST too.
#include <benchmark/benchmark.h>

#include "src/balance/dst_exchange.hpp"
#include "src/balance/length_presets.hpp"
#include "tests/balance/dst_reference.hpp"   // the original DST, for before/after figures
#include "tests/balance/plan_reference.hpp"  // the original planner, for before/after figures

using namespace sb;

namespace {

constexpr int64_t kCap = 65536;
constexpr int kMb = 16;

std::vector<Segment> global_batch(int ranks) {
  LengthSampler s(Preset::LongAlign, kCap, 1);
  std::vector<std::pair<uint64_t, uint64_t>> docs;
  for (double tokens = 0; tokens < 0.9 * ranks * kMb * double(kCap);) {
    docs.push_back({docs.size(), s.next()});
    tokens += double(docs.back().second);
  }
  return make_segments(docs, kCap, false);
}

const ModelShape kShape{32, 128, 1};

void BM_MakePlan(benchmark::State& st) {
  int ranks = int(st.range(0));
  const Batching b = Batching(st.range(1));
  auto segs = global_batch(ranks);
  LatencyModel lm(kShape);
  for (auto _ : st) benchmark::DoNotOptimize(make_plan(segs, ranks, kMb, kCap, b, lm, 32));
  st.SetLabel(batching_name(b));
  st.counters["segments"] = double(segs.size());
  st.counters["per_segment"] = benchmark::Counter(double(segs.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Two-level plan (PlanOptions::group_ranks = 64): what one rank computes, its own group's part.
void BM_MakeGroupPlan(benchmark::State& st) {
  int ranks = int(st.range(0));
  const Batching b = Batching(st.range(1));
  auto segs = global_batch(ranks);
  LatencyModel lm(kShape);
  PlanOptions o;
  o.group_ranks = 64;
  int me = 0;
  for (auto _ : st) benchmark::DoNotOptimize(make_group_plan(segs, ranks, kMb, kCap, b, lm, 32, o, me)), me = (me + 977) % ranks;
  st.SetLabel(batching_name(b));
}

// The original implementation (same plans, tests/balance/plan_reference.hpp), for comparison.
void BM_MakePlanReference(benchmark::State& st) {
  int ranks = int(st.range(0));
  const Batching b = Batching(st.range(1));
  auto segs = global_batch(ranks);
  LatencyModel lm(kShape);
  for (auto _ : st) benchmark::DoNotOptimize(ref::reference_make_plan(segs, ranks, kMb, kCap, b, lm, 32, {}));
  st.SetLabel(batching_name(b));
  st.counters["per_segment"] = benchmark::Counter(double(segs.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// What one rank pays for DST: its own items and summary, T* over all ranks' summaries, its greedy.
// Arguments: ranks, target (0 mean, 1 recall), implementation (0 current, 1 the original one,
// tests/balance/dst_reference.hpp: the same summaries, T* and budgets).
// A sparse plan of `ranks` ranks and every rank's DST summary: what the exchange hands each rank.
struct DstSetup {
  LatencyModel lm{kShape};
  RecallModel rm{kShape};
  Plan plan;
  DstParams p;
  std::vector<RankSummary> sums;
  DstSetup(int ranks, Target target) {
    plan = make_plan(global_batch(ranks), ranks, kMb, kCap, Batching::Sparse, lm, 32);
    p.k0 = 32, p.n_layers = kShape.n_layers, p.target = target;
    for (int r = 0; r < ranks; ++r) sums.push_back(summarize(build_items(plan.ranks[size_t(r)], lm, rm, p), p));
  }
};

void BM_TuneOneRank(benchmark::State& st) {
  const bool reference = st.range(2);
  DstSetup d(int(st.range(0)), st.range(1) ? Target::Recall : Target::Mean);
  auto& [lm, rm, plan, p, sums] = d;
  for (auto _ : st) {
    DstItems mine = build_items(plan.ranks[0], lm, rm, p);
    sums[0] = reference ? ref::summarize(mine, p) : summarize(mine, p);
    double T = reference ? ref::target_time(sums, p) : target_time(sums, p);
    benchmark::DoNotOptimize(reference ? ref::tune_rank(mine, T, p) : tune_rank(mine, T, p));
  }
  st.SetLabel(reference ? "reference" : "");
}

// T* alone over every rank's summary (target = recall: the bisection over the recall curves).
void BM_TargetTime(benchmark::State& st) {
  const bool reference = st.range(1);
  const DstSetup d(int(st.range(0)), Target::Recall);
  for (auto _ : st) benchmark::DoNotOptimize(reference ? ref::target_time(d.sums, d.p) : target_time(d.sums, d.p));
  st.SetLabel(reference ? "reference" : "");
}

// Unpacking every rank's gathered summary (target = recall: with the curves), into fresh
// summaries (arg 1 = 0) or into those of the step before (1, what `train` does).
void BM_UnpackAll(benchmark::State& st) {
  const DstSetup d(int(st.range(0)), Target::Recall);
  const size_t n = packed_size(d.p);
  std::vector<double> all;
  for (const auto& s : d.sums) {
    const auto v = pack(s, d.p);
    all.insert(all.end(), v.begin(), v.end());
  }
  std::vector<RankSummary> out(d.sums.size());
  for (auto _ : st) {
    if (st.range(1)) {
      for (size_t r = 0; r < out.size(); ++r) unpack(std::span<const double>(all.data() + n * r, n), out[r]);
    } else {
      std::vector<RankSummary> fresh;
      fresh.reserve(out.size());
      for (size_t r = 0; r < out.size(); ++r) fresh.push_back(unpack(std::span<const double>(all.data() + n * r, n)));
      benchmark::DoNotOptimize(fresh.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  st.SetLabel(st.range(1) ? "reused" : "fresh");
}

}  // namespace

BENCHMARK(BM_MakePlan)->ArgsProduct({{64, 512, 4096}, {0, 1, 2, 3}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MakeGroupPlan)->ArgsProduct({{512, 4096}, {1, 2, 3}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MakePlanReference)->ArgsProduct({{64, 512, 4096}, {0, 1, 2, 3}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TuneOneRank)->ArgsProduct({{64, 512, 4096}, {0, 1}, {0, 1}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TargetTime)->ArgsProduct({{512, 4096}, {0, 1}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_UnpackAll)->ArgsProduct({{4096}, {0, 1}})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
