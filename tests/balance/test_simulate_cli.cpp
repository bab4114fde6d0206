// `sparsebalance simulate` end to end through the built program, small size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/run_program.hpp"

namespace {

int run(const std::string& args) { return sbtest::run_program("simulate " + args).rc; }

nlohmann::json summary(const std::string& extra, const std::string& name) {
  auto path = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove(path);
  int rc = run("--set simulate.ranks=8 --set simulate.micro_batches=4 --set simulate.steps=2 --set simulate.capacity=8192 "
               "--set simulate.n_layers=4 --set simulate.k=8 --set simulate.block_size=64 " + extra + " --summary " + path);
  EXPECT_EQ(rc, 0) << extra;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

}  // namespace

TEST(SimulateCli, SummaryKeysFiniteAndDeterministic) {
  auto a = summary("--set simulate.seed=5", "sb_sim_a.json");
  auto b = summary("--set simulate.seed=5", "sb_sim_b.json");
  for (auto key : {"policies", "lower_bound", "ranks", "micro_batches", "preset", "steps"}) EXPECT_TRUE(a.contains(key)) << key;
  EXPECT_EQ(a["ranks"], 8); EXPECT_EQ(a["micro_batches"], 4); EXPECT_EQ(a["preset"], "longalign"); EXPECT_EQ(a["steps"], 2);
  int n = 0;
  for (auto b_ : {"sequential", "tokens", "quadratic", "sparse"})
    for (auto t : {"fixed", "dst"}) {
      std::string name = std::string(b_) + "+" + t;
      ASSERT_TRUE(a["policies"].contains(name)) << name;
      const auto& p = a["policies"][name];
      for (auto key : {"makespan", "imbalance", "bubble", "recall", "speedup", "plan_ms"}) ASSERT_TRUE(p.contains(key)) << name << " " << key;
      double sp = p["speedup"];
      EXPECT_TRUE(std::isfinite(sp) && sp > 0) << name;
      EXPECT_GE(double(p["imbalance"]), 1.0);
      EXPECT_GE(double(p["makespan"]), double(a["lower_bound"]) * (1 - 1e-9)) << name;
      // Same seed, same numbers (all but the measured planning time).
      for (auto key : {"makespan", "imbalance", "bubble", "recall", "speedup"})
        EXPECT_EQ(double(p[key]), double(b["policies"][name][key])) << name << " " << key;
      ++n;
    }
  EXPECT_EQ(n, 8);
  EXPECT_DOUBLE_EQ(double(a["policies"]["sequential+fixed"]["speedup"]), 1.0);
  auto c = summary("--set simulate.seed=6 --set simulate.preset=chatqa2 --set balance.target=recall", "sb_sim_c.json");
  EXPECT_EQ(c["preset"], "chatqa2");
  EXPECT_NE(double(c["policies"]["sparse+dst"]["makespan"]), double(a["policies"]["sparse+dst"]["makespan"]));
  EXPECT_NE(run("--set simulate.preset=zipf"), 0);  // a bad key value fails cleanly
}

// balance.group_ranks: the two-level plan runs end to end, partitions like the one-level plan (same
// sequential rows), and SAB stays balanced with groups of 2 of 8 ranks.
TEST(SimulateCli, TwoLevelGroups) {
  auto one = summary("--set simulate.seed=5", "sb_sim_g1.json");
  auto two = summary("--set simulate.seed=5 --set balance.group_ranks=2", "sb_sim_g2.json");
  ASSERT_TRUE(two.contains("policies"));
  EXPECT_EQ(double(two["policies"]["sequential+fixed"]["makespan"]), double(one["policies"]["sequential+fixed"]["makespan"]));
  EXPECT_LT(double(two["policies"]["sparse+dst"]["imbalance"]), 1.05);
  EXPECT_LT(double(two["policies"]["sparse+fixed"]["makespan"]), double(one["policies"]["sequential+fixed"]["makespan"]));
  EXPECT_NE(run("--set balance.group_ranks=-1"), 0);
}

// attention.dense_layers: the hybrid layers cost dense in every sparse policy (a slower makespan than
// the same run all sparse, recall at least as high: the dense layers keep everything), and a layer
// outside simulate.n_layers is refused.
TEST(SimulateCli, DenseLayersCostDense) {
  auto all = summary("--set simulate.seed=5", "sb_sim_d0.json");
  auto hyb = summary("--set simulate.seed=5 --set attention.dense_layers=last:2", "sb_sim_d2.json");
  for (auto name : {"sparse+fixed", "sparse+dst"}) {
    EXPECT_GT(double(hyb["policies"][name]["makespan"]), double(all["policies"][name]["makespan"])) << name;
    EXPECT_GE(double(hyb["policies"][name]["recall"]), double(all["policies"][name]["recall"])) << name;
  }
  EXPECT_NE(run("--set simulate.n_layers=4 --set attention.dense_layers=4"), 0);
}
