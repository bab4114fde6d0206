// The distributed step in-process on 1, 2 and 4 ranks: all ranks agree on the plan and hold
// bit-identical parameters after every step; token-weighted reduction makes the loss independent
// of the rank count.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "base/hash.hpp"
#include "io/checkpoint.hpp"
#include "io/h5.hpp"
#include "src/comm/comm.hpp"
#include "src/train/trainer.hpp"
#include "train_test_util.hpp"

using namespace sbtest;
namespace fs = std::filesystem;


TEST(TrainMpi, RanksStayBitIdenticalAndBudgetsMoveBothWays) {
  sb::Comm comm;
  std::string dir = scratch(comm, "dst");
  sb::Config cfg = tiny_config(dir, "--set train.steps=5 --set balance.batching=sequential --set balance.tuning=dst"
                                    " --set balance.self_profile=false");  // analytic costs: the same budgets on any load
  sb::Trainer t(cfg, comm, "", 0);
  sb::TrainResult r = t.run();  // train.sync_check_every = 1: throws if ranks ever differ
  EXPECT_EQ(r.last_step, 5);
  const auto& w = t.model().weights();
  EXPECT_TRUE(comm.all_equal(sb::fnv1a(w.data(), w.size() * sizeof(float))));
  EXPECT_LT(r.last_loss, r.first_loss);
  if (comm.size() >= 2) {
    // Long-tail data in data order (sequential batching) leaves ranks imbalanced: DST must both
    // raise budgets (ranks below T*) and lower them (ranks above).
    EXPECT_GT(r.budgets_above_k0, 0);
    EXPECT_GT(r.budgets_below_k0, 0);
  }
}

// balance.group_ranks: each rank plans only its group. Every document is still trained once per
// step: with fixed budgets the first step's loss (over the whole global batch, at the initial
// weights) equals the one-level plan's, up to summation order; ranks stay identical.
TEST(TrainMpi, TwoLevelPlanTrainsTheSameBatch) {
  sb::Comm comm;
  std::string dir = scratch(comm, "group");
  const std::string base = "--set train.steps=3 --set balance.batching=sparse --set balance.tuning=fixed"
                           " --set balance.self_profile=false --set checkpoint.dir=" + dir + "/ckpt";
  sb::Config one = tiny_config(dir, base + " --set log.path=" + dir + "/one.h5");
  sb::Config two = tiny_config(dir, base + " --set log.path=" + dir + "/two.h5 --set balance.group_ranks=" +
                                        std::to_string(std::max(1, comm.size() / 2)));
  sb::Trainer t1(one, comm, "", 0);
  sb::TrainResult r1 = t1.run();
  sb::Trainer t2(two, comm, "", 0);
  sb::TrainResult r2 = t2.run();
  EXPECT_EQ(r2.last_step, 3);
  EXPECT_NEAR(r2.first_loss, r1.first_loss, 1e-4 * r1.first_loss);
  EXPECT_TRUE(std::isfinite(r2.last_loss));
  const auto& w = t2.model().weights();
  EXPECT_TRUE(comm.all_equal(sb::fnv1a(w.data(), w.size() * sizeof(float))));
}

// balance.recall_alpha is the recall model's starting exponent (saved in checkpoints as
// /recall/alpha); with balance.ema = 0 nothing learned online moves it.
TEST(TrainMpi, RecallAlphaFromConfig) {
  sb::Comm comm;
  std::string dir = scratch(comm, "alpha");
  sb::Config cfg = tiny_config(dir, "--set train.steps=1 --set checkpoint.every=1 --set balance.recall_alpha=1.75"
                                    " --set balance.ema=0 --set balance.self_profile=false");
  sb::Trainer t(cfg, comm, "", 0);
  sb::TrainResult r = t.run();
  if (comm.root()) {
    sb::h5::Id f = sb::h5::open_read(r.checkpoint);
    auto alpha = sb::h5::read_vector<double>(f, "recall/alpha", r.checkpoint);
    ASSERT_EQ(alpha.size(), size_t(cfg.i("model.n_layers")));
    for (double a : alpha) EXPECT_DOUBLE_EQ(a, 1.75);
  }
}

// balance.curve_points reaches the tuner `train` runs (it used to reach only `simulate`; train
// exchanged 32 points whatever the config said): the size of every rank's exchanged summary
// under balance.target = recall follows it, and the run trains with it.
TEST(TrainMpi, CurvePointsFromConfig) {
  sb::Comm comm;
  std::string dir = scratch(comm, "curve");
  sb::Config cfg = tiny_config(dir, "--set train.steps=2 --set balance.target=recall --set balance.tuning=dst"
                                    " --set balance.curve_points=5 --set balance.self_profile=false");
  sb::Trainer t(cfg, comm, "", 0);
  EXPECT_EQ(t.settings().balance.dst.curve_points, 5);
  EXPECT_EQ(sb::packed_size(t.settings().balance.dst), size_t(8 + 4 * 5));
  sb::TrainResult r = t.run();
  EXPECT_EQ(r.last_step, 2);
  EXPECT_TRUE(std::isfinite(r.last_loss));
}

// LoRA ([lora]): at init B = 0, so the first step's loss is the full model's at the same seed, on
// any rank count; ranks stay bit-identical; the frozen base is the same after training (hash);
// ZeRO-1 over the trainable tensors gives plain data parallelism's adapters.
TEST(TrainMpi, LoraStartsAsTheBaseAndKeepsItFrozen) {
  sb::Comm comm;
  std::string dir = scratch(comm, "lora");
  const std::string base = "--set train.steps=2 --set balance.tuning=fixed --set balance.self_profile=false"
                           " --set checkpoint.dir=" + dir + "/ckpt";
  const std::string lora = " --set lora.rank=4 --set lora.alpha=8 --set lora.train_also=norm";
  sb::Trainer full(tiny_config(dir, base + " --set log.path=" + dir + "/full.h5 --set train.steps=1"), comm, "", 0);
  const std::vector<float> init = full.model().weights();
  const double full_loss = full.run().first_loss;
  sb::Trainer t(tiny_config(dir, base + lora + " --set log.path=" + dir + "/lora.h5"), comm, "", 0);
  const std::vector<float> base0 = t.model().base();
  EXPECT_TRUE(base0 == init) << "the LoRA base is not the full model's init of the same seed";
  sb::TrainResult r = t.run();  // train.sync_check_every = 1: throws if ranks ever differ
  EXPECT_EQ(r.first_loss, full_loss);
  EXPECT_NE(r.last_loss, r.first_loss);
  EXPECT_TRUE(t.model().base() == base0) << "training changed the frozen base";
  const auto& w = t.model().weights();
  EXPECT_EQ(w.size(), t.model().layout().size);
  EXPECT_TRUE(comm.all_equal(sb::fnv1a(w.data(), w.size() * sizeof(float))));
  sb::Trainer z(tiny_config(dir, base + lora + " --set log.path=" + dir + "/zero.h5 --set train.zero=1"), comm, "", 0);
  sb::TrainResult rz = z.run();
  EXPECT_EQ(rz.first_loss, r.first_loss);
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, double(std::abs(z.model().weights()[i] - w[i])));
  EXPECT_LT(worst, 1e-6);
}
