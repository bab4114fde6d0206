// Loss masks in training: the target count and packing of masked windows, a constant response
// behind random prompts learned to near-zero masked loss (which the unmasked loss cannot reach),
// the masked loss independent of the rank count, and resume still bit-exact with masks.
#include <gtest/gtest.h>

#include <random>

#include "io/checkpoint.hpp"
#include "src/balance/plan.hpp"
#include "src/data/prep.hpp"
#include "src/train/batch.hpp"
#include "train_test_util.hpp"

using namespace sbtest;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  std::string d = (fs::temp_directory_path() / ("sb_train_masks_" + name)).string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

nlohmann::json train(const std::string& data, const std::string& dir, int ranks, const std::string& extra,
                     const std::string& tag) {
  std::string sum = dir + "/" + tag + ".json";
  int rc = sh(mpirun(ranks) + binary() + " train" + tiny_flags(data, dir) + extra + " --summary " + sum,
              dir + "/" + tag + ".log");
  EXPECT_EQ(rc, 0) << slurp(dir + "/" + tag + ".log");
  return rc == 0 ? read_json(sum) : nlohmann::json{};
}

// prep synth --mask answers: documents up to 1024 tokens, windowed at micro_batch_tokens 512.
std::string answers_corpus() {
  static std::string data;
  if (data.empty()) {
    std::string dir = fresh_dir("answers");
    sb::SynthOptions so;
    so.preset = "uniform", so.docs = 160, so.seed = 3, so.max_len = 1024, so.min_len = 100;
    sb::PrepOptions o;
    o.output = data = dir + "/data", o.mask = "answers";
    sb::prep_synth(so, o);
  }
  return data;
}

}  // namespace

TEST(TrainMasks, CountAndPackKeepEachWindowsPartOfTheMask) {
  std::string dir = fresh_dir("unit");
  sb::ShardMeta meta{259, "byte", 257};
  std::vector<uint32_t> toks(10);
  for (uint32_t i = 0; i < 10; ++i) toks[i] = 100 + i;
  std::vector<uint8_t> mask = {0, 1, 1, 0, 0, 1, 0, 1, 1, 1};
  {
    sb::ShardWriter w(dir + "/s.h5", meta);
    w.add(toks, {}, mask);
    w.add(std::vector<uint32_t>(4, 5));  // unmasked: all 3 targets trained
    w.close();
  }
  sb::Dataset ds = sb::Dataset::open(dir + "/s.h5");
  // Document 0 in windows of 4: [0,4) [4,8) [8,10); position t targets token t+1 iff mask[t+1].
  std::vector<std::pair<uint64_t, uint64_t>> docs = {{0, 10}, {1, 4}};
  auto segs = sb::make_segments(docs, 4, false);
  ASSERT_EQ(segs.size(), 4u);
  // window targets: [1,2,3] -> 1+1+0, [5,6,7] -> 1+0+1, [9] -> 1, doc 1 -> 3
  EXPECT_EQ(sb::count_targets(ds, segs), 2 + 2 + 1 + 3);
  sb::MicroBatch mb;
  mb.segs = segs;
  sb::PackedBatch b = sb::pack_micro_batch(ds, mb);
  std::vector<int32_t> want = {101, 102, -1, -1,   // window [0,4): targets 1,2 trained, 3 not, end
                               105, -1, 107, -1,   // window [4,8)
                               109, -1,            // window [8,10)
                               5, 5, 5, -1};       // document 1, no mask
  EXPECT_EQ(b.targets, want);
  int64_t trained = 0;
  for (int32_t t : b.targets) trained += t >= 0;
  EXPECT_EQ(trained, sb::count_targets(ds, segs));
}

TEST(TrainMasks, ConstantResponseLearnedOnlyWithTheMask) {
  // Random lowercase prompts, a fixed delimiter, then always the same response. Trained on the
  // response only the loss goes to ~0; trained on everything it cannot fall below the prompts'
  // entropy (~ln 26 = 3.3 nats on most targets).
  std::string dir = fresh_dir("constant");
  std::mt19937 rng(5);
  std::string masked, plain;
  for (int i = 0; i < 300; ++i) {
    std::string p;
    for (int n = 40 + int(rng() % 50), k = 0; k < n; ++k) p += char('a' + rng() % 26);
    p += "\\n=> ";
    masked += R"({"prompt": ")" + p + R"(", "response": "0123456789"})" "\n";
    plain += R"({"text": ")" + p + R"(0123456789"})" "\n";
  }
  std::ofstream(dir + "/masked.jsonl") << masked;
  std::ofstream(dir + "/plain.jsonl") << plain;
  sb::PrepOptions o;
  o.output = dir + "/m";
  sb::prep_text({dir + "/masked.jsonl"}, "jsonl", "blank-lines", o);
  o.output = dir + "/p";
  sb::prep_text({dir + "/plain.jsonl"}, "jsonl", "blank-lines", o);
  const std::string fast = " --set train.steps=40 --set train.lr=3e-2 --set train.weight_decay=0 --set model.n_layers=1"
                           " --set train.sync_check_every=0";
  fs::create_directories(dir + "/rm"), fs::create_directories(dir + "/rp");
  auto m = train(dir + "/m", dir + "/rm", 1, fast, "run");
  auto p = train(dir + "/p", dir + "/rp", 1, fast, "run");
  ASSERT_FALSE(m.empty());
  ASSERT_FALSE(p.empty());
  EXPECT_GT(m["first_loss"].get<double>(), 5.0);  // ~ln 259 at the start: a mean, not a sum
  EXPECT_LT(m["last_loss"].get<double>(), 0.15);
  EXPECT_GT(p["last_loss"].get<double>(), 1.5);
  // eval reports the loss over the trained targets beside the loss over all of them.
  std::string sum = dir + "/eval.json";
  int rc = sh(mpirun(1) + binary() + " eval --checkpoint " + m["checkpoint"].get<std::string>() +
                  " --set eval.docs=16 --summary " + sum, dir + "/eval.log");
  ASSERT_EQ(rc, 0) << slurp(dir + "/eval.log");
  auto e = read_json(sum);
  EXPECT_LT(e["loss_masked"].get<double>(), 0.3);
  EXPECT_GT(e["loss"].get<double>(), 1.5);  // the prompts were never trained
  EXPECT_EQ(e["targets_masked"].get<int64_t>(), 10 * e["docs"].get<int64_t>());  // "0123456789" per document
}

TEST(TrainMasks, OneAndTwoRanksSameMaskedLossesAndResumeExact) {
  std::string data = answers_corpus();
  std::string a = fresh_dir("np1"), b = fresh_dir("np2"), c = fresh_dir("np2part");
  const std::string flags = " --set train.steps=6 --set balance.batching=tokens";
  auto one = train(data, a, 1, flags, "full");
  auto two = train(data, b, 2, flags, "full");
  ASSERT_EQ(one["losses"].size(), 6u);
  ASSERT_EQ(two["losses"].size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_NEAR(one["losses"][i].get<double>(), two["losses"][i].get<double>(), 2e-4) << "step " << i + 1;
  EXPECT_GT(one["first_loss"].get<double>(), 4.0);  // the answers' digits, ~ln 259 untrained
  // Resume at 2 ranks: the masked run continues bit for bit.
  auto p1 = train(data, c, 2, flags + " --stop-at 3", "first");
  auto p2 = train(data, c, 2, flags + " --resume", "second");
  std::vector<double> joined = p1["losses"].get<std::vector<double>>();
  for (double x : p2["losses"].get<std::vector<double>>()) joined.push_back(x);
  EXPECT_EQ(joined, two["losses"].get<std::vector<double>>());
  auto ca = sb::read_checkpoint(two["checkpoint"].get<std::string>());
  auto cb = sb::read_checkpoint(p2["checkpoint"].get<std::string>());
  EXPECT_TRUE(ca.params == cb.params) << "parameters differ after resume";
}
