// End-to-end training through the real binary and mpirun: rank-count independence, resume bit
// for bit, falling loss, what the checkpoint and log hold, eval, and clear errors.
#include <gtest/gtest.h>
#include <mpi.h>

#include "io/checkpoint.hpp"
#include "io/metrics_log.hpp"
#include "base/error.hpp"
#include "train_test_util.hpp"

using namespace sbtest;
namespace fs = std::filesystem;

namespace {

struct Dir {
  std::string path;
  explicit Dir(const std::string& name) : path((fs::temp_directory_path() / ("sb_train_cli_" + name)).string()) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
};

nlohmann::json train(const std::string& dir, int ranks, const std::string& extra, const std::string& tag) {
  std::string data = make_corpus(fs::path(dir).parent_path().string() + "/sb_train_cli_corpus");
  std::string sum = dir + "/" + tag + ".json";
  int rc = sh(mpirun(ranks) + binary() + " train" + tiny_flags(data, dir) + extra + " --summary " + sum, dir + "/" + tag + ".log");
  EXPECT_EQ(rc, 0) << slurp(dir + "/" + tag + ".log");
  return rc == 0 ? read_json(sum) : nlohmann::json{};
}

}  // namespace

class TrainCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::create_directories(fs::temp_directory_path() / "sb_train_cli_corpus");
    make_corpus((fs::temp_directory_path() / "sb_train_cli_corpus").string());
  }
};

TEST_F(TrainCli, OneAndTwoRanksGiveTheSameLossesAndTheLossFalls) {
  Dir a("np1"), b("np2");
  auto one = train(a.path, 1, " --set train.steps=12 --set balance.batching=tokens", "run");
  // Two ranks also run the chunked LM head and layer recomputation; a peak for mfu (the CPU reports none without it).
  auto two = train(b.path, 2,
                   " --set train.steps=12 --set balance.batching=tokens --set train.peak_tflops=0.001"
                   " --set model.lm_head_chunk=7 --set train.recompute=layer",
                   "run");
  ASSERT_EQ(one["losses"].size(), 12u);
  ASSERT_EQ(two["losses"].size(), 12u);
  for (size_t i = 0; i < 12; ++i)
    EXPECT_NEAR(one["losses"][i].get<double>(), two["losses"][i].get<double>(), 2e-4) << "step " << i + 1;
  EXPECT_LT(one["last_loss"].get<double>(), one["first_loss"].get<double>() - 0.5);  // ln(259) = 5.56 at the start
  EXPECT_EQ(two["ranks"], 2);
  for (const char* key : {"steps", "first_loss", "last_loss", "tokens_per_s", "mean_imbalance", "checkpoint", "log"})
    EXPECT_TRUE(two.contains(key)) << key;
  EXPECT_EQ(one["mfu"].get<double>(), 0.0);  // no peak known on the CPU
  EXPECT_GT(two["mfu"].get<double>(), 0.0);
  EXPECT_EQ(two["peak_mem_gib"].get<double>(), 0.0);
}

TEST_F(TrainCli, ResumeIsBitExactAtOneAndTwoRanks) {
  for (int ranks : {1, 2}) {
    Dir full("full" + std::to_string(ranks)), part("part" + std::to_string(ranks));
    auto f = train(full.path, ranks, " --set train.steps=6", "full");
    auto p1 = train(part.path, ranks, " --set train.steps=6 --stop-at 3", "first");
    auto p2 = train(part.path, ranks, " --set train.steps=6 --resume", "second");
    ASSERT_EQ(p1["last_step"], 3);
    ASSERT_EQ(p2["first_step"], 4);
    std::vector<double> joined = p1["losses"].get<std::vector<double>>();
    for (double x : p2["losses"].get<std::vector<double>>()) joined.push_back(x);
    EXPECT_EQ(joined, f["losses"].get<std::vector<double>>()) << "ranks " << ranks;
    auto ca = sb::read_checkpoint(f["checkpoint"].get<std::string>());
    auto cb = sb::read_checkpoint(p2["checkpoint"].get<std::string>());
    EXPECT_EQ(ca.step, 6);
    EXPECT_TRUE(ca.params == cb.params) << "parameters differ after resume, ranks " << ranks;
    EXPECT_TRUE(ca.m == cb.m && ca.v == cb.v) << "optimizer moments differ, ranks " << ranks;
    // The resumed log holds each step once, in order.
    auto log = sb::read_metrics(p2["log"].get<std::string>());
    ASSERT_EQ(log.steps.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(log.steps[i].step, int64_t(i + 1));
    EXPECT_EQ(log.steps[5].loss, f["last_loss"].get<double>());
  }
}

TEST_F(TrainCli, CheckpointAndLogHoldTheExpectedNamesAndShapes) {
  Dir d("layout");
  auto s = train(d.path, 2, " --set train.steps=4 --set checkpoint.every=2 --set checkpoint.keep=1", "run");
  auto ck = sb::read_checkpoint(s["checkpoint"].get<std::string>());
  EXPECT_EQ(ck.step, 4);
  EXPECT_EQ(ck.ranks, 2);
  EXPECT_EQ(sb::list_checkpoints(d.path + "/ckpt").size(), 1u);  // keep = 1
  ASSERT_FALSE(ck.tensors.empty());
  EXPECT_EQ(ck.tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(ck.tensors[0].shape, (std::vector<int64_t>{259, 32}));
  bool found_k = false;
  for (const auto& t : ck.tensors)
    if (t.name == "model.layers.1.self_attn.k_proj.weight") {
      found_k = true;
      EXPECT_EQ(t.shape, (std::vector<int64_t>{16, 32}));
    }
  EXPECT_TRUE(found_k);
  EXPECT_NE(ck.config_toml.find("micro_batch_tokens = 512"), std::string::npos);
  auto log = sb::read_metrics(s["log"].get<std::string>());
  EXPECT_EQ(log.n_ranks, 2);
  ASSERT_EQ(log.steps.size(), 4u);
  ASSERT_EQ(log.ranks.size(), 8u);
  for (const auto& r : log.ranks) {
    EXPECT_GT(r.compute_ms, 0);
    EXPECT_GE(r.idle_ms, 0);
    EXPECT_GT(r.tokens, 0);
    EXPECT_GT(r.density, 0);
    EXPECT_LE(r.density, 1.0);
  }
  // eval reads the checkpoint and reports dense and sparse loss and task accuracy
  std::string sum = d.path + "/eval.json";
  int rc = sh(mpirun(2) + binary() + " eval --checkpoint " + s["checkpoint"].get<std::string>() + " --set eval.docs=8 --summary " + sum,
              d.path + "/eval.log");
  ASSERT_EQ(rc, 0) << slurp(d.path + "/eval.log");
  auto e = read_json(sum);
  EXPECT_GT(e["loss"].get<double>(), 0);
  EXPECT_GT(e["loss_sparse"].get<double>(), 0);
  EXPECT_TRUE(e["task_accuracy"].contains("overall"));
  EXPECT_GT(e["tokens"].get<int64_t>(), 0);
}

TEST_F(TrainCli, BadInputsGiveClearErrors) {
  Dir d("errors");
  std::string log = d.path + "/err.log";
  int rc = sh(binary() + " train --set data.path=" + d.path + "/nope --set log.progress=false", log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(log).find(d.path + "/nope"), std::string::npos) << slurp(log);
  rc = sh(binary() + " train --set model.n_heads=3 --set data.path=" + make_corpus((fs::temp_directory_path() / "sb_train_cli_corpus").string()), log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(log).find("must be divisible by model.n_heads"), std::string::npos) << slurp(log);
  // train.device = "cuda": a shape the CUDA kernels do not take is named (in a build without CUDA,
  // the build is); the tiny config's head dim is 8.
  const std::string corpus = make_corpus((fs::temp_directory_path() / "sb_train_cli_corpus").string());
  rc = sh(binary() + " train" + tiny_flags(corpus, d.path) + " --set train.device=cuda", log);
  EXPECT_NE(rc, 0);
#ifdef SB_WITH_CUDA
  EXPECT_NE(slurp(log).find("model.d_model / model.n_heads = 8; the CUDA attention kernels take 64 or 128"),
            std::string::npos) << slurp(log);
  rc = sh(binary() + " train" + tiny_flags(corpus, d.path) +
              " --set train.device=cuda --set model.d_model=128 --set model.n_heads=2 --set model.n_kv_heads=1",
          log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(log).find("attention.block_size = 16; the CUDA attention kernels take 64 or 128"), std::string::npos)
      << slurp(log);
#else
  EXPECT_NE(slurp(log).find("train.device = \"cuda\": this build has no CUDA support"), std::string::npos) << slurp(log);
#endif
  // A corrupt checkpoint is named on resume.
  fs::create_directories(d.path + "/ckpt");
  std::ofstream(d.path + "/ckpt/ckpt_00000002.h5") << "not hdf5 at all";
  rc = sh(binary() + " train" + tiny_flags(make_corpus((fs::temp_directory_path() / "sb_train_cli_corpus").string()), d.path) +
              " --resume " + d.path + "/ckpt/ckpt_00000002.h5",
          log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(log).find("ckpt_00000002.h5"), std::string::npos) << slurp(log);
}
