// Across real MPI ranks: the same plan everywhere, one exchange, the same T* and predictions
// everywhere, and each rank's budgets equal what the pure tune() computes for it. With the
// two-level plan (balance.group_ranks) each rank plans only its group: the same result.
#include <algorithm>

#include <gtest/gtest.h>
#include <mpi.h>

#include "src/balance/dst_exchange.hpp"
#include "src/balance/length_presets.hpp"
#include "src/comm/comm.hpp"

using namespace sb;

namespace {
template <class T>
bool same_everywhere(T x, MPI_Datatype type) {
  T lo, hi;
  MPI_Allreduce(&x, &lo, 1, type, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&x, &hi, 1, type, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}
RankExchange comm_exchange(const Comm& comm) {
  return {comm.rank(), comm.size(), [&comm](auto mine, auto all) { comm.allgather(mine, all); }};
}
}  // namespace

TEST(BalanceMpi, SamePlanSameTargetOwnBudgets) {
  Comm comm;
  ModelShape shape{4, 64, 1};
  LatencyModel lm(shape);
  RecallModel rm(shape);
  for (int l = 0; l < 4; ++l) rm.set_alpha(l, 0.3 + 0.1 * l);
  for (Target target : {Target::Mean, Target::Recall}) {
    for (Batching b : {Batching::Sequential, Batching::Sparse}) {
      SCOPED_TRACE(std::string(target_name(target)) + " " + batching_name(b));
      LengthSampler s(Preset::LongAlign, 8192, 99);
      std::vector<std::pair<uint64_t, uint64_t>> docs;
      for (int i = 0; i < 50 * comm.size(); ++i) docs.push_back({uint64_t(i), s.next()});
      auto segs = make_segments(docs, 8192, false);
      Plan plan = make_plan(segs, comm.size(), 4, 8192, b, lm, 8);
      EXPECT_TRUE(same_everywhere<unsigned long long>(plan.hash(), MPI_UNSIGNED_LONG_LONG));

      DstParams p;
      p.k0 = 8, p.max_change = 0.25, p.n_layers = 4, p.target = target, p.tuning = Tuning::Dst;
      TuneResult got = exchange_and_tune(comm_exchange(comm), plan.ranks[size_t(comm.rank())], lm, rm, p);
      EXPECT_TRUE(same_everywhere<double>(got.target_ms, MPI_DOUBLE));
      ASSERT_EQ(int(got.rank_predicted_ms.size()), comm.size());
      for (double t : got.rank_predicted_ms) EXPECT_TRUE(same_everywhere<double>(t, MPI_DOUBLE));
      EXPECT_TRUE(same_everywhere<double>(got.planned_imbalance_after, MPI_DOUBLE));

      // The pure function on locally computed data for every rank gives the same answer.
      DstInput in;
      for (int r = 0; r < comm.size(); ++r) {
        auto items = build_items(plan.ranks[size_t(r)], lm, rm, p);
        in.ranks.push_back(summarize(items, p));
        if (r == comm.rank()) in.mine = items;
      }
      TuneResult pure = tune(in, comm.rank(), p);
      EXPECT_EQ(got.k, pure.k);
      EXPECT_EQ(got.target_ms, pure.target_ms);
      EXPECT_EQ(got.rank_predicted_ms, pure.rank_predicted_ms);
      EXPECT_EQ(got.my_predicted_ms, pure.my_predicted_ms);
    }
  }
}

TEST(BalanceMpi, GroupPlanExchangeMatchesWholePlan) {
  Comm comm;
  ModelShape shape{4, 64, 1};
  LatencyModel lm(shape);
  RecallModel rm(shape);
  for (int l = 0; l < 4; ++l) rm.set_alpha(l, 0.3 + 0.1 * l);
  LengthSampler s(Preset::LongAlign, 8192, 7);
  std::vector<std::pair<uint64_t, uint64_t>> docs;
  for (int i = 0; i < 40 * comm.size(); ++i) docs.push_back({uint64_t(i), s.next()});
  auto segs = make_segments(docs, 8192, false);
  PlanOptions opt;
  opt.group_ranks = std::max(1, comm.size() / 2);  // 2 groups at 2 and 4 ranks
  Plan whole = make_plan(segs, comm.size(), 4, 8192, Batching::Sparse, lm, 8, opt);
  GroupPlan group = make_group_plan(segs, comm.size(), 4, 8192, Batching::Sparse, lm, 8, opt, comm.rank());
  const auto& mine = group.ranks[size_t(comm.rank() - group.first_rank)];
  const auto& want = whole.ranks[size_t(comm.rank())];
  ASSERT_EQ(mine.size(), want.size());
  for (size_t m = 0; m < mine.size(); ++m) {
    ASSERT_EQ(mine[m].segs.size(), want[m].segs.size());
    for (size_t i = 0; i < mine[m].segs.size(); ++i) EXPECT_EQ(mine[m].segs[i].doc, want[m].segs[i].doc);
  }
  DstParams p;
  p.k0 = 8, p.max_change = 0.25, p.n_layers = 4, p.target = Target::Mean, p.tuning = Tuning::Dst;
  TuneResult got = exchange_and_tune(comm_exchange(comm), mine, lm, rm, p);
  DstInput in;
  for (int r = 0; r < comm.size(); ++r) {
    auto items = build_items(whole.ranks[size_t(r)], lm, rm, p);
    in.ranks.push_back(summarize(items, p));
    if (r == comm.rank()) in.mine = items;
  }
  TuneResult pure = tune(in, comm.rank(), p);
  EXPECT_EQ(got.k, pure.k);
  EXPECT_EQ(got.target_ms, pure.target_ms);
  EXPECT_TRUE(same_everywhere<double>(got.target_ms, MPI_DOUBLE));
}
