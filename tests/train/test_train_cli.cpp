// End-to-end training through the real binary and mpirun: rank-count independence, resume bit
// for bit, falling loss, what the checkpoint and log hold, eval, and clear errors.
#include <gtest/gtest.h>
#include <mpi.h>

#include <set>

#include "io/checkpoint.hpp"
#include "io/metrics_log.hpp"
#include "base/error.hpp"
#include "src/train/batch.hpp"
#include "tests/error_of.hpp"
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

// Two sources for data.sources: the shared corpus (160 documents) and a smaller one of other lengths.
std::pair<std::string, std::string> mix_corpora() {
  const std::string a = make_corpus((fs::temp_directory_path() / "sb_train_cli_corpus").string());
  const std::string dir = (fs::temp_directory_path() / "sb_train_cli_corpus_b").string(), b = dir + "/data";
  fs::create_directories(dir);
  if (!fs::exists(b + "/shard_00000.h5")) {
    std::string cmd = binary() + " prep synth --preset longalign --docs 40 --seed 5 --max-len 256 --min-len 48 --output " + b;
    if (sh(cmd, dir + "/prep.log") != 0) throw std::runtime_error("prep failed: " + slurp(dir + "/prep.log"));
  }
  return {a, b};
}

// A tiny run on data.sources = [{a, 0.75}, {b, 0.25}] (tiny_flags without data.path).
nlohmann::json train_mix(const std::string& dir, int ranks, const std::string& extra, const std::string& tag) {
  auto [a, b] = mix_corpora();
  std::string flags = tiny_flags(a, dir);
  flags.erase(0, flags.find(" --set", 1));  // drop " --set data.path=..."
  flags += " --set 'data.sources=[{ path = \"" + a + "\", weight = 3 }, { path = \"" + b + "\", weight = 1 }]'";
  std::string sum = dir + "/" + tag + ".json";
  int rc = sh(mpirun(ranks) + binary() + " train" + flags + extra + " --summary " + sum, dir + "/" + tag + ".log");
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

// data.sources' draw: shares by weight, the same draw for the same seed, resumable from its cursor,
// each source's own training split (its validation documents never drawn).
TEST_F(TrainCli, MixtureDrawsByWeightDeterministicallyAndResumes) {
  auto [a, b] = mix_corpora();
  sb::Dataset ds = sb::Dataset::open_sources({a, b});
  ASSERT_EQ(ds.num_sources(), 2u);
  ASSERT_EQ(ds.source_begin(1), 160u);
  ASSERT_EQ(ds.num_docs(), 200u);
  // pick_source alone: 20000 draws of weights (0.6, 0.3, 0.1) within 0.01 of them.
  const std::vector<double> w3 = {0.6, 0.3, 0.1};
  std::vector<int> count(3, 0);
  for (int64_t n = 0; n < 20000; ++n) count[sb::pick_source(w3, 1234, n)] += 1;
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(count[i] / 20000.0, w3[i], 0.01) << "source " << i;

  const std::vector<double> w = {0.75, 0.25};
  auto draw = [&](uint64_t seed, int batches, sb::MixCursor& cur, std::vector<std::vector<uint64_t>>& orders) {
    std::vector<uint64_t> docs;
    std::vector<int64_t> per(2, 0);
    for (int i = 0; i < batches; ++i) {
      auto gb = sb::draw_mixture_batch(ds, w, seed, 0.1, 2048, cur, orders);
      for (auto [doc, len] : gb.docs) {
        docs.push_back(doc);
        per[ds.source_of(doc)] += 1;
      }
      EXPECT_EQ(gb.source_docs[0] + gb.source_docs[1], int64_t(gb.docs.size()));
    }
    return std::make_pair(docs, per);
  };
  // 300 batches (~1700 documents): source b (36 training documents) wraps through many epochs.
  sb::MixCursor c1;
  std::vector<std::vector<uint64_t>> o1;
  auto [docs, per] = draw(7, 300, c1, o1);
  const double share = double(per[0]) / double(per[0] + per[1]);
  EXPECT_NEAR(share, 0.75, 0.03) << per[0] << " + " << per[1] << " documents";
  EXPECT_GT(c1.epochs[1], 3);
  EXPECT_EQ(c1.draws, int64_t(docs.size()));  // synth documents are never empty
  std::set<uint64_t> val;
  for (size_t src = 0; src < 2; ++src)
    for (uint64_t d : ds.source_val_docs(src, 7, 0.1)) val.insert(d);
  EXPECT_EQ(val.size(), 16u + 4u);  // 10% of each source
  for (uint64_t d : docs) ASSERT_FALSE(val.count(d)) << "validation document " << d << " drawn for training";
  // Same seed: the same draw; another seed: another.
  sb::MixCursor c2;
  std::vector<std::vector<uint64_t>> o2;
  EXPECT_EQ(draw(7, 300, c2, o2).first, docs);
  sb::MixCursor c3;
  std::vector<std::vector<uint64_t>> o3;
  EXPECT_NE(draw(8, 300, c3, o3).first, docs);
  // Resume: the cursor after 137 batches alone (as a checkpoint stores it, no cached orders) continues the same.
  sb::MixCursor c4;
  std::vector<std::vector<uint64_t>> o4;
  auto first = draw(7, 137, c4, o4).first;
  sb::MixCursor stored{c4.epochs, c4.indexes, c4.draws};
  std::vector<std::vector<uint64_t>> fresh;
  auto rest = draw(7, 163, stored, fresh).first;
  first.insert(first.end(), rest.begin(), rest.end());
  EXPECT_EQ(first, docs);
  EXPECT_EQ(stored.epochs, c1.epochs);
  EXPECT_EQ(stored.indexes, c1.indexes);
}

// Bad mixtures are named: a missing source directory, data.path beside data.sources, another tokenizer.
TEST_F(TrainCli, MixtureErrorsNameTheSource) {
  auto [a, b] = mix_corpora();
  Dir d("mix_errors");
  std::string m = sbtest::error_of([&] { sb::Dataset::open_sources({a, d.path + "/nope"}); });
  EXPECT_NE(m.find("data.sources[1].path = " + d.path + "/nope"), std::string::npos) << m;
  const std::vector<std::string> both = {"data.path=" + a, "data.sources=[{ path = \"" + b + "\", weight = 1 }]"};
  m = sbtest::error_of([&] { sb::data_settings(sb::Config::load("", both)); });
  EXPECT_NE(m.find("data.path and data.sources are both given"), std::string::npos) << m;
  const std::vector<std::string> one = {"data.sources=[{ path = \"" + a + "\", weight = 2 }, { path = \"" + b + "\", weight = 6 }]"};
  auto set = sb::data_settings(sb::Config::load("", one));
  ASSERT_EQ(set.sources.size(), 2u);
  EXPECT_DOUBLE_EQ(set.sources[0].weight, 0.25);  // normalised
  EXPECT_DOUBLE_EQ(set.sources[1].weight, 0.75);
  // Through the program: the message reaches the user and names the key.
  std::string log = d.path + "/err.log";
  int rc = sh(binary() + " train --set log.progress=false --set 'data.sources=[{ path = \"" + a +
                  "\", weight = 1 }, { path = \"" + d.path + "/nope\", weight = 1 }]'", log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(log).find("data.sources[1].path = " + d.path + "/nope"), std::string::npos) << slurp(log);
  rc = sh(binary() + " train --set log.progress=false --set 'data.sources=[{ path = \"" + a + "\", weight = 0 }]'", log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(log).find("'data.sources[0].weight' must be a positive finite number, got 0"), std::string::npos) << slurp(log);
}

// A mixture's run: resume bit for bit at 2 ranks (the sampler's cursor in the checkpoint), the
// same draw at 1 rank, the shares in the summary, the metrics log and inspect, eval per source.
TEST_F(TrainCli, MixtureResumesBitExactAndReportsShares) {
  Dir full("mix_full"), part("mix_part"), one("mix_np1");
  auto f = train_mix(full.path, 2, " --set train.steps=6 --set balance.batching=tokens", "full");
  auto p1 = train_mix(part.path, 2, " --set train.steps=6 --set balance.batching=tokens --stop-at 3", "first");
  auto p2 = train_mix(part.path, 2, " --set train.steps=6 --set balance.batching=tokens --resume", "second");
  auto s1 = train_mix(one.path, 1, " --set train.steps=6 --set balance.batching=tokens", "run");
  ASSERT_EQ(p2["first_step"], 4);
  std::vector<double> joined = p1["losses"].get<std::vector<double>>();
  for (double x : p2["losses"].get<std::vector<double>>()) joined.push_back(x);
  EXPECT_EQ(joined, f["losses"].get<std::vector<double>>());
  auto ca = sb::read_checkpoint(f["checkpoint"].get<std::string>());
  auto cb = sb::read_checkpoint(p2["checkpoint"].get<std::string>());
  EXPECT_TRUE(ca.params == cb.params) << "parameters differ after resume";
  EXPECT_EQ(ca.source_epochs, cb.source_epochs);
  EXPECT_EQ(ca.source_indexes, cb.source_indexes);
  EXPECT_EQ(ca.data_draws, cb.data_draws);
  ASSERT_EQ(ca.source_indexes.size(), 2u);
  // The summary: per source, documents and their share, next to the weight.
  ASSERT_EQ(f["sources"].size(), 2u);
  int64_t docs = 0;
  for (const auto& x : f["sources"]) docs += x["docs"].get<int64_t>();
  EXPECT_EQ(docs, ca.data_draws);
  EXPECT_DOUBLE_EQ(f["sources"][1]["weight"].get<double>(), 0.25);
  EXPECT_GT(f["sources"][1]["docs"].get<int64_t>(), 0);
  // The log: one row per step and source, the resumed log equal to the uninterrupted one; 1 rank draws the same.
  auto lf = sb::read_metrics(f["log"].get<std::string>()), lp = sb::read_metrics(p2["log"].get<std::string>()),
       l1 = sb::read_metrics(s1["log"].get<std::string>());
  ASSERT_EQ(lf.n_sources, 2);
  ASSERT_EQ(lf.sources.size(), 12u);
  ASSERT_EQ(lp.sources.size(), 12u);
  ASSERT_EQ(l1.sources.size(), 12u);
  int64_t logged = 0;
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(lf.sources[i].step, int64_t(i / 2 + 1));
    EXPECT_EQ(lf.sources[i].source, int32_t(i % 2));
    EXPECT_EQ(lp.sources[i].docs, lf.sources[i].docs) << "row " << i;
    EXPECT_EQ(lp.sources[i].tokens, lf.sources[i].tokens) << "row " << i;
    EXPECT_EQ(l1.sources[i].docs, lf.sources[i].docs) << "row " << i;
    logged += lf.sources[i].docs;
  }
  EXPECT_EQ(logged, docs);
  // inspect: the log's per-source totals.
  auto r = sbtest::run_program("inspect " + f["log"].get<std::string>() + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sources"].size(), 2u);
  EXPECT_EQ(j["sources"][0]["docs"].get<int64_t>(), f["sources"][0]["docs"].get<int64_t>());
  EXPECT_DOUBLE_EQ(j["sources"][1]["share_docs"].get<double>(), f["sources"][1]["share_docs"].get<double>());
  // eval: the loss of each source's validation documents (the stored config names the mixture).
  std::string sum = full.path + "/eval.json";
  int rc = sh(binary() + " eval --checkpoint " + f["checkpoint"].get<std::string>() + " --set eval.docs=6 --summary " + sum,
              full.path + "/eval.log");
  ASSERT_EQ(rc, 0) << slurp(full.path + "/eval.log");
  auto e = read_json(sum);
  ASSERT_EQ(e["sources"].size(), 2u);
  EXPECT_EQ(e["sources"][0]["docs"].get<int64_t>() + e["sources"][1]["docs"].get<int64_t>(), e["docs"].get<int64_t>());
  // Validation takes the sources in turn: data.val_fraction = 0.05 holds out 8 and 2 documents.
  EXPECT_EQ(e["sources"][0]["docs"].get<int64_t>(), 4);
  EXPECT_EQ(e["sources"][1]["docs"].get<int64_t>(), 2);
  for (const auto& x : e["sources"]) EXPECT_GT(x["loss"].get<double>(), 0);
  // Resuming the mixture's checkpoint on one dataset (data.path) is refused, naming both layouts.
  const std::string a = mix_corpora().first, log = part.path + "/refused.log";
  rc = sh(binary() + " train" + tiny_flags(a, part.path) + " --set train.steps=8 --resume " + p2["checkpoint"].get<std::string>(), log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(log).find("the checkpoint's data cursor is for 2 data.sources, this run reads one dataset (data.path)"),
            std::string::npos) << slurp(log);
}
