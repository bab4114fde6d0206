// DST properties on constructed inputs (the pure tune(), all ranks modelled in-process).
#include <gtest/gtest.h>

#include <algorithm>

#include "src/balance/dst_exchange.hpp"
#include "src/balance/length_presets.hpp"
#include "base/error.hpp"

using namespace sb;

namespace {

struct World {
  LatencyModel lm{ModelShape{4, 64, 1}};
  RecallModel rm{ModelShape{4, 64, 1}};
  Plan plan;
  std::vector<DstItems> items;
  std::vector<RankSummary> sums;
  std::vector<TuneResult> res;
  double T = 0;

  World() {
    for (int l = 0; l < 4; ++l) rm.set_alpha(l, 0.3 + 0.15 * l);  // layers differ in sensitivity
  }
  void run(const DstParams& p) {
    items.clear(), sums.clear(), res.clear();
    for (const auto& r : plan.ranks) items.push_back(build_items(r, lm, rm, p)), sums.push_back(summarize(items.back(), p));
    T = target_time(sums, p);
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      DstInput in{sums, items[r]};
      res.push_back(tune(in, int(r), p));
    }
  }
  double mean_recall() const {
    double s = 0, w = 0;
    for (const auto& r : res) s += r.my_recall * r.my_weight, w += r.my_weight;
    return s / w;
  }
};

// Imbalanced on purpose: sequential split of a long-tailed batch.
Plan imbalanced_plan(const LatencyModel& lm, int ranks) {
  LengthSampler s(Preset::LongAlign, 8192, 5);
  std::vector<std::pair<uint64_t, uint64_t>> docs;
  for (int i = 0; i < 40 * ranks; ++i) docs.push_back({uint64_t(i), s.next()});
  auto segs = make_segments(docs, 8192, false);
  return make_plan(segs, ranks, 4, 8192, Batching::Sequential, lm, 8);
}

DstParams params(Target t) {
  DstParams p;
  p.k0 = 8, p.max_change = 0.5, p.n_layers = 4, p.target = t, p.tuning = Tuning::Dst;
  return p;
}

}  // namespace

TEST(Dst, BudgetBounds) {
  DstParams p = params(Target::Mean);
  int i0 = -1;
  auto ks = budget_steps(p, &i0);
  EXPECT_EQ(ks.front(), 4); EXPECT_EQ(ks.back(), 12); EXPECT_EQ(ks[size_t(i0)], 8);
  p.k_min = 6, p.k_max = 9;
  ks = budget_steps(p, &i0);
  EXPECT_EQ(ks.front(), 6); EXPECT_EQ(ks.back(), 9); EXPECT_EQ(ks[size_t(i0)], 8);
  EXPECT_EQ(parse_target("recall"), Target::Recall);
  EXPECT_THROW(parse_target("median"), Error);
  EXPECT_THROW(parse_tuning("auto"), Error);
}

TEST(Dst, NobodyAboveTargetUnlessAtLowerBound_BothWays_WithinBounds) {
  for (Target t : {Target::Mean, Target::Min, Target::Max, Target::Recall}) {
    SCOPED_TRACE(target_name(t));
    World w;
    w.plan = imbalanced_plan(w.lm, 8);
    DstParams p = params(t);
    p.k_min = 5, p.k_max = 11;  // tighter than the cap [4, 12]
    w.run(p);
    int lowered = 0, raised = 0;
    for (size_t r = 0; r < w.res.size(); ++r) {
      const auto& res = w.res[r];
      EXPECT_DOUBLE_EQ(res.target_ms, w.T);
      if (res.my_predicted_ms > w.T * (1 + 1e-9)) {  // above T*: must be fully lowered
        EXPECT_NEAR(res.my_predicted_ms, w.sums[r].ms_lo, 1e-9 * w.sums[r].ms_lo) << "rank " << r;
      }
      if (w.sums[r].ms_k0 <= w.T) {
        EXPECT_LE(res.my_predicted_ms, w.T * (1 + 1e-9)) << "raised past T*";
      }
      for (const auto& mb : res.k)
        for (int k : mb) {
          EXPECT_GE(k, 5); EXPECT_LE(k, 11);
          lowered += k < 8, raised += k > 8;
        }
      // Predicted time matches the latency model at the chosen budgets.
      double t_model = 0;
      for (size_t m = 0; m < res.k.size(); ++m) t_model += w.lm.micro_batch_ms(w.plan.ranks[r][m], res.k[m]);
      EXPECT_NEAR(res.my_predicted_ms, t_model, 1e-9 * t_model);
    }
    if (t == Target::Mean || t == Target::Recall) {
      EXPECT_GT(lowered, 0);
      EXPECT_GT(raised, 0);
    }
    if (t == Target::Min) {
      EXPECT_GT(lowered, 0);
    }
    if (t == Target::Max) {
      EXPECT_GT(raised, 0);
      EXPECT_EQ(lowered, 0);
    }
    if (t != Target::Max) {
      EXPECT_LT(w.res[0].planned_imbalance_after, w.res[0].planned_imbalance_before);
    }
  }
}

TEST(Dst, RecallTargetKeepsMeanRecall) {
  World w;
  w.plan = imbalanced_plan(w.lm, 8);
  DstParams p = params(Target::Recall);
  p.tuning = Tuning::Fixed;
  w.run(p);
  double base = w.mean_recall();
  double mk0 = 0;
  for (const auto& r : w.res) mk0 = std::max(mk0, r.my_predicted_ms);
  p.tuning = Tuning::Dst;
  for (int G : {2, 8, 32}) {
    p.curve_points = G;
    w.run(p);
    EXPECT_GE(w.mean_recall(), base) << "curve points " << G;
    double mk = 0;
    for (const auto& r : w.res) mk = std::max(mk, r.my_predicted_ms);
    EXPECT_LT(mk, mk0) << "curve points " << G;  // and faster than fixed k0
  }
}

TEST(Dst, PerfectBalanceMovesNothing) {
  World w;
  std::vector<MicroBatch> same(3);
  for (int m = 0; m < 3; ++m) same[size_t(m)] = {{Segment{uint64_t(m), 0, 4000}, Segment{uint64_t(m + 9), 0, 1500}}, 5500};
  w.plan.ranks.assign(4, same);
  for (Target t : {Target::Mean, Target::Min, Target::Max, Target::Recall}) {
    DstParams p = params(t);
    w.run(p);
    for (const auto& r : w.res)
      for (const auto& mb : r.k)
        for (int k : mb) EXPECT_EQ(k, 8) << target_name(t);
    EXPECT_NEAR(w.res[0].planned_imbalance_after, 1.0, 1e-12);
  }
}

TEST(Dst, FixedLeavesK0AndReportsTimes) {
  World w;
  w.plan = imbalanced_plan(w.lm, 4);
  DstParams p = params(Target::Mean);
  p.tuning = Tuning::Fixed;
  w.run(p);
  for (size_t r = 0; r < w.res.size(); ++r) {
    for (const auto& mb : w.res[r].k)
      for (int k : mb) EXPECT_EQ(k, 8);
    EXPECT_DOUBLE_EQ(w.res[r].rank_predicted_ms[r], w.sums[r].ms_k0);
    EXPECT_DOUBLE_EQ(w.res[r].my_predicted_ms, w.sums[r].ms_k0);
  }
  EXPECT_GT(w.res[0].planned_imbalance_before, 1.05);
  EXPECT_DOUBLE_EQ(w.res[0].planned_imbalance_after, w.res[0].planned_imbalance_before);
}

// Hybrid layers (attention.dense_layers): DST tunes only the sparse layers (the dense ones stay at
// k0), and its predicted times are the latency model's, which costs the dense layers dense.
TEST(Dst, DenseLayersAreNotTunedAndCostDense) {
  World w;
  w.lm.set_dense_layers({0, 1, 0, 1});
  w.plan = imbalanced_plan(w.lm, 8);
  w.run(params(Target::Mean));
  int moved = 0;
  for (size_t r = 0; r < w.res.size(); ++r) {
    const auto& res = w.res[r];
    double t_model = 0;
    for (size_t m = 0; m < res.k.size(); ++m) {
      EXPECT_EQ(res.k[m][1], 8) << "a dense layer's budget moved";
      EXPECT_EQ(res.k[m][3], 8) << "a dense layer's budget moved";
      moved += (res.k[m][0] != 8) + (res.k[m][2] != 8);
      t_model += w.lm.micro_batch_ms(w.plan.ranks[r][m], res.k[m]);
    }
    EXPECT_NEAR(res.my_predicted_ms, t_model, 1e-9 * t_model) << "rank " << r;
  }
  EXPECT_GT(moved, 0);
  EXPECT_LT(w.res[0].planned_imbalance_after, w.res[0].planned_imbalance_before);
  // the same budgets cost more with dense layers on a long document (dense attention dominates; on
  // short ones, where the budget keeps nearly every block anyway, the gating saved can win)
  LatencyModel sparse_lm{ModelShape{4, 64, 1}};
  const MicroBatch mb{{Segment{0, 0, 8192}}, 8192};
  EXPECT_GT(w.lm.micro_batch_ms(mb, 8), sparse_lm.micro_batch_ms(mb, 8));
}

TEST(Dst, PackUnpackAndEmptyRank) {
  World w;
  w.plan = imbalanced_plan(w.lm, 3);
  w.plan.ranks.push_back({});  // a rank with nothing still works
  DstParams p = params(Target::Recall);
  w.run(p);
  for (size_t r = 0; r < w.sums.size(); ++r) {
    auto packed = pack(w.sums[r], p);
    EXPECT_EQ(packed.size(), packed_size(p));  // one size for all: a plain MPI_Allgather
    auto back = unpack(packed);
    EXPECT_EQ(back.n_mb, int(w.plan.ranks[r].size()));
    EXPECT_EQ(back.n_mb, w.sums[r].n_mb);
    EXPECT_EQ(back.hi_rec, w.sums[r].hi_rec);
    EXPECT_EQ(back.ms_k0, w.sums[r].ms_k0);
  }
  EXPECT_TRUE(w.res.back().k.empty());
  EXPECT_EQ(w.res.back().my_predicted_ms, 0);
}

// The exchange takes its collective as a function: here every rank's summary is packed up front
// and the "all-gather" concatenates them, so exchange_and_tune() runs for each rank in-process and
// must match the pure tune() (the same check test_balance_mpi makes over real ranks).
TEST(Dst, ExchangeThroughAnyAllGather) {
  World w;
  w.plan = imbalanced_plan(w.lm, 3);
  for (Target t : {Target::Mean, Target::Recall}) {
    DstParams p = params(t);
    w.run(p);
    std::vector<double> packed;
    for (const auto& s : w.sums) {
      auto v = pack(s, p);
      packed.insert(packed.end(), v.begin(), v.end());
    }
    DstExchange work;  // reused across ranks, as across steps
    for (int r = 0; r < 3; ++r) {
      RankExchange ex{r, 3, [&](std::span<const double> mine, std::span<double> all) {
                        ASSERT_EQ(mine.size(), packed_size(p));
                        ASSERT_EQ(all.size(), packed.size());
                        std::copy(packed.begin(), packed.end(), all.begin());
                      }};
      TuneResult got = exchange_and_tune(ex, w.plan.ranks[size_t(r)], w.lm, w.rm, p, work);
      EXPECT_EQ(got.k, w.res[size_t(r)].k);
      EXPECT_EQ(got.target_ms, w.T);
      EXPECT_EQ(got.rank_predicted_ms, w.res[size_t(r)].rank_predicted_ms);
    }
  }
}
