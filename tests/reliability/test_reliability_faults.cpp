// Issue 24: faults that hung a job or lost data, through the real binary.
//  1. an error on one rank (injected in every phase of the step, or a real one: a bad token id,
//     an unusable log.path) ends the whole job within seconds, the message on stderr, at 2 and 4
//     ranks, the failing rank a non-zero one too;
//  2. resume from an older checkpoint: the newer ones and their log rows are archived, not mixed
//     or deleted; a moved-aside log is never overwritten;
//  3. prep --overwrite keeps the old shards until the new set is complete;
//  4. hostile inputs (vocab sizes, NaN in the checkpoint's models, FIFOs, directories, flags)
//     are errors naming what is at fault.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <vector>

#include "io/checkpoint.hpp"
#include "io/metrics_log.hpp"
#include "reliability_util.hpp"

using namespace rel;

namespace {

std::string g_data;

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A model small enough that a 4-rank job starts and runs a step in well under a second.
std::string flags(const std::string& dir, const std::string& extra = "") {
  return " --set data.path=" + g_data + " --set checkpoint.dir=" + dir + "/ckpt --set log.path=" + dir +
         "/metrics.h5 --set model.n_layers=1 --set model.d_model=16 --set model.n_heads=2 --set model.n_kv_heads=1"
         " --set model.ffn_dim=32 --set train.global_batch_tokens=1024 --set train.micro_batch_tokens=256"
         " --set attention.block_size=16 --set log.progress=false --set balance.self_profile=false"
         " --set checkpoint.every=1 --set train.steps=3" + extra;
}

std::string train(const std::string& dir, const std::string& extra = "") { return binary() + " train" + flags(dir, extra); }

// Runs under `timeout` (a hang fails the test instead of the suite) and returns the output.
struct Outcome {
  Exit exit;
  std::string out;
};
Outcome run_bounded(const std::string& cmd, const std::string& log) {
  fs::remove(log);
  Outcome o;
  o.exit = run("timeout -s KILL 30 " + cmd, log);
  o.out = slurp(log);
  return o;
}

// The whole job ended promptly, unsuccessfully, with `message` on its output.
void expect_job_error(const Outcome& o, const std::string& message, const std::string& what) {
  EXPECT_NE(o.exit.code, 0) << what << "\n" << o.out;
  EXPECT_NE(o.exit.code, 137) << what << ": killed by the timeout (the job hung)\n" << o.out;
  EXPECT_LT(o.exit.seconds, 10.0) << what << "\n" << o.out;
  EXPECT_TRUE(has(o.out, message)) << what << ": expected '" << message << "'\n" << o.out;
}

}  // namespace

class Faults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = (fs::temp_directory_path() / "sb_rel_faults_corpus").string();
    g_data = dir + "/data";
    if (!fs::exists(g_data + "/shard_00000.h5")) {
      fs::create_directories(dir);
      auto e = run(binary() + " prep synth --docs 60 --max-len 256 --min-len 32 --seed 5 --output " + g_data,
                   dir + "/prep.log");
      ASSERT_EQ(e.code, 0) << slurp(dir + "/prep.log");
    }
  }
};

// ---- 1. an error on one rank ends the job (it used to hang in MPI_Finalize)
TEST_F(Faults, InjectedErrorInEveryPhaseEndsTheJobWithTheMessage) {
  auto dir = scratch("inject");
  const std::vector<std::string> phases = {"plan",    "predict", "exchange", "tune",   "compute",
                                           "reduce",  "update",  "measure",  "record", "checkpoint"};
  for (const auto& phase : phases) {
    for (int rank : {1, 0}) {
      if (rank == 0 && phase != "plan" && phase != "reduce" && phase != "checkpoint") continue;
      const std::string x = " --set train.inject_error_step=2 --set train.inject_error_rank=" + std::to_string(rank) +
                            " --set train.inject_error_phase=" + phase;
      auto o = run_bounded(mpirun(2) + train(dir, x), dir + "/run.log");
      expect_job_error(o, "error on rank " + std::to_string(rank) + ": injected fault on rank " + std::to_string(rank) +
                              " at step 2 in phase " + phase, phase + " on rank " + std::to_string(rank));
    }
  }
  // Four ranks, the last one failing, in a collective's phase.
  for (const std::string phase : {"exchange", "reduce"}) {
    auto o = run_bounded(mpirun(4) + train(dir, " --set train.inject_error_step=1 --set train.inject_error_rank=3"
                                                " --set train.inject_error_phase=" + phase),
                         dir + "/run4.log");
    expect_job_error(o, "error on rank 3: injected fault on rank 3 at step 1 in phase " + phase, phase + " at 4 ranks");
  }
  // Off by default, and a rank outside the job never fires.
  auto o = run_bounded(mpirun(2) + train(dir, " --set train.inject_error_step=2 --set train.inject_error_rank=5"),
                       dir + "/off.log");
  EXPECT_EQ(o.exit.code, 0) << o.out;
}
