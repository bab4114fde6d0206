// The distributed step in-process on 1, 2 and 4 ranks: all ranks agree on the plan and hold
// bit-identical parameters after every step; token-weighted reduction makes the loss independent
// of the rank count.
#include <gtest/gtest.h>
#include <mpi.h>

#include "io/checkpoint.hpp"
#include "src/comm/comm.hpp"
#include "src/step/trainer.hpp"
#include "train_test_util.hpp"

using namespace sbtest;
namespace fs = std::filesystem;

TEST(TrainMpi, RanksStayBitIdenticalAndBudgetsMoveBothWays) {
  sb::Comm comm;
  std::string dir = (fs::temp_directory_path() / ("sb_train_mpi_np" + std::to_string(comm.size()))).string();
  if (comm.root()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    make_corpus(dir, 200, 1024);
  }
  comm.barrier();
  std::vector<std::string> sets;
  std::string flags = tiny_flags(dir + "/data", dir) + " --set train.steps=5 --set balance.batching=sequential --set balance.tuning=dst"
                      " --set balance.self_profile=false";  // analytic costs: the same budgets on any machine load
  for (size_t at = flags.find("--set "); at != std::string::npos; at = flags.find("--set ", at + 1)) {
    size_t end = flags.find(' ', at + 6);
    sets.push_back(flags.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6));
  }
  sb::Config cfg = sb::Config::load("", sets);
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
