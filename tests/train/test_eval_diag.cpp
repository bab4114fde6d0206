// eval on masked data (span_accuracy) and the sparse-retrieval diagnostics (eval --diagnose), in
// process on the CPU engine: a model forced to predict each token's own input (its next-token
// prediction repeats the current token) gets exactly the records right whose every trained token
// repeats the one before it, computed here from the records; the diagnostics of a small random model
// keep every needle and lose no recall when the gate keeps every block, lose both at k = 0, and find
// the synthetic tasks' needles where the corpus put them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "src/config/config.hpp"
#include "src/data/prep.hpp"
#include "src/data/synth.hpp"
#include "src/eval/diagnose.hpp"
#include "src/eval/evaluate.hpp"
#include "src/train/batch.hpp"
#include "io/metrics_log.hpp"
#include "tests/train/train_test_util.hpp"

using namespace sb;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  std::string d = (fs::temp_directory_path() / ("sb_eval_diag_" + name)).string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Settings tiny_settings(const std::string& data, int64_t vocab, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"data.path=" + data, "model.n_layers=2", "model.d_model=32", "model.n_heads=4",
                                   "model.n_kv_heads=2", "model.ffn_dim=48", "train.micro_batch_tokens=512",
                                   "attention.block_size=16", "data.val_fraction=0.9", "eval.docs=1000",
                                   "eval.buckets=24,64"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return from_config(Config::load("", sets), vocab);
}

}  // namespace

TEST(EvalSpanAccuracy, RecordsRightExactlyWhenEveryTrainedTokenIsPredicted) {
  const std::string dir = fresh_dir("span");
  // Responses / assistant turns that repeat their previous token throughout are right for the
  // identity predictor; one differing character anywhere in the trained span makes the record wrong.
  std::ofstream(dir + "/r.jsonl") << R"({"prompt": "what xx", "response": "xxxx"})" "\n"
                                     R"({"prompt": "what xx", "response": "xxxy"})" "\n"
                                     R"({"prompt": "long question about zzzzzz", "response": "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"})" "\n"
                                     R"({"prompt": "long question about zzzzzz", "response": "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzq"})" "\n"
                                     R"({"prompt": "a", "response": "b"})" "\n"
                                     R"({"prompt": "qq", "response": "q"})" "\n"
                                     R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\n\n\n"}]})" "\n"
                                     R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\n\n\n"}, {"role": "user", "content": "again"}, {"role": "assistant", "content": "\nx\n"}]})" "\n"
                                     R"({"text": "aaaaaaaaaaaa"})" "\n"
                                     R"({"text": "aaaaaaaaaaab"})" "\n"
                                     R"({"prompt": "mm", "response": "mmmmmm"})" "\n"
                                     R"({"prompt": "mm", "response": "mmmnmm"})" "\n";
  PrepOptions o;
  o.output = dir + "/data";
  prep_text({dir + "/r.jsonl"}, "jsonl", "blank-lines", o);
  Dataset ds = Dataset::open(o.output);
  ASSERT_TRUE(ds.has_masks());
  const Settings s = tiny_settings(o.output, ds.vocab_size(), {});
  // The identity predictor: zero attention and MLP (the residual stream stays the token's
  // embedding), distinct unit embedding rows, tied head: logits = E . E[x], largest at x.
  Model<float> model(s.model);
  model.init(1);
  std::vector<float>& w = model.weights();
  for (const auto& p : model.params())
    if (p.decay && p.name != "model.embed_tokens.weight") std::fill(w.begin() + int64_t(p.offset), w.begin() + int64_t(p.offset + p.size), 0.f);
  const auto& e = model.param("model.embed_tokens.weight");
  const int C = s.model.d_model;
  for (int64_t v = 0; v < e.shape[0]; v++) {
    float* row = w.data() + e.offset + size_t(v) * C;
    double n = 0;
    for (int c = 0; c < C; c++) n += double(row[c]) * row[c];
    for (int c = 0; c < C; c++) row[c] = float(row[c] / std::sqrt(n));
  }
  Comm comm;
  AdamW opt(s.optim, model.weights().size());
  auto engine = make_engine(s.engine(), comm, model, opt);
  engine->from_host();
  const EvalResult r = evaluate(s, comm, *engine, ds);
  // Expected, from the records: right iff every trained token equals the token before it.
  int64_t want = 0, total = 0;
  std::vector<int64_t> want_bucket(3, 0), total_bucket(3, 0);
  for (uint64_t doc : r.doc_ids) {
    const uint64_t len = ds.doc_length(doc);
    const std::vector<uint32_t> t = read_segment(ds, Segment{doc, 0, len});
    const std::vector<uint8_t> m = ds.read_mask(doc, 0, len);
    bool any = false, ok = true;
    for (size_t i = 1; i < t.size(); i++)
      if (m[i]) any = true, ok = ok && t[i] == t[i - 1];
    if (!any) continue;
    const size_t b = len <= 24 ? 0 : len <= 64 ? 1 : 2;
    total += 1, want += ok, total_bucket[b] += 1, want_bucket[b] += ok;
  }
  ASSERT_GE(total, 8);
  EXPECT_GE(want, 3);
  EXPECT_LT(want, total);
  EXPECT_EQ(r.dense.span_total, total);
  EXPECT_EQ(r.dense.span_correct, want);
  EXPECT_EQ(r.sparse.span_correct, want);  // attention contributes nothing here: sparse agrees
  EXPECT_EQ(r.dense.bucket_span_correct, want_bucket);
  EXPECT_EQ(r.dense.bucket_span_total, total_bucket);
}

TEST(EvalDiagnose, FindNeedleFindsTheEvidenceTheCorpusPlaced) {
  SynthOptions so;
  so.preset = "uniform", so.docs = 30, so.seed = 5, so.min_len = 300, so.max_len = 900;
  SynthCorpus corpus(so);
  int found = 0;
  for (uint64_t i = 0; i < so.docs; i++) {
    const SynthDoc d = corpus.doc(i);
    if (!d.task.type) continue;
    std::vector<uint32_t> toks(d.text.begin(), d.text.end());
    for (auto& t : toks) t &= 0xff;
    const auto [b, e] = find_needle(toks, 0, d.task);
    ASSERT_LT(b, e) << "doc " << i;
    EXPECT_LT(e, d.task.begin);
    EXPECT_EQ(d.text.substr(b, e - b), d.text.substr(d.task.begin, d.task.end - d.task.begin));
    const std::string before = d.text.substr(0, b);
    if (d.task.type == 1) EXPECT_TRUE(before.ends_with("The pass key is ")) << before.substr(before.size() - 30);
    if (d.task.type == 2) EXPECT_TRUE(before.ends_with(" is ")) << before.substr(before.size() - 30);
    if (d.task.type == 3) EXPECT_TRUE(before.ends_with("\": \"")) << before.substr(before.size() - 30);
    // a window that starts after the needle has none
    const uint64_t w = e;
    std::vector<uint32_t> tail(toks.begin() + int64_t(w), toks.end());
    EXPECT_EQ(find_needle(tail, w, d.task).second, 0u);
    found++;
  }
  EXPECT_GE(found, 20);
}

TEST(EvalDiagnose, KeepingEveryBlockKeepsTheNeedlesAndTheRecall) {
  const std::string dir = fresh_dir("diag");
  SynthOptions so;
  so.preset = "uniform", so.docs = 24, so.seed = 7, so.min_len = 200, so.max_len = 480;
  PrepOptions o;
  o.output = dir + "/data", o.mask = "answers";
  prep_synth(so, o);
  Dataset ds = Dataset::open(o.output);
  Comm comm;
  auto run = [&](const std::vector<std::string>& extra) {
    const Settings s = tiny_settings(o.output, ds.vocab_size(), extra);
    Model<float> model(s.model);
    model.init(3);
    AdamW opt(s.optim, model.weights().size());
    auto engine = make_engine(s.engine(), comm, model, opt);
    engine->from_host();
    return diagnose(s, comm, *engine, ds);
  };
  const nlohmann::json all = run({"attention.k=1000", "attention.theta=1e9", "eval.diagnose_rows=6"});
  ASSERT_GE(all["docs"].get<int>(), 15);
  EXPECT_EQ(all["docs_with_needle"], all["docs"]);  // short documents: the window holds the needle
  const auto& acc = all["accuracy"];
  for (const auto& pass : {acc["sparse"], acc["oracle"], acc["dense_layer"][0], acc["dense_layer"][1],
                           acc["sparse_layer"][0], acc["sparse_layer"][1]})
    EXPECT_EQ(pass["overall"]["correct"], acc["dense"]["overall"]["correct"]);
  ASSERT_EQ(all["layers"].size(), 2u);
  for (const auto& l : all["layers"]) {
    EXPECT_DOUBLE_EQ(l["needle_kept"].get<double>(), 1.0);
    EXPECT_NEAR(l["recall_true_answer"].get<double>(), 1.0, 1e-5);
    EXPECT_NEAR(l["recall_true_sampled"].get<double>(), 1.0, 1e-5);
    EXPECT_GE(l["needle_rank"].get<double>(), 1.0);
    EXPECT_LE(l["needle_rank"].get<double>(), l["candidates"].get<double>());
    EXPECT_EQ(l["heads"].size(), 2u);
    EXPECT_EQ(l["heads"][0]["sampled_rows"].get<int>() + l["heads"][1]["sampled_rows"].get<int>(),
              6 * all["docs"].get<int>());
  }
  // Anchors only (sink and diagonal): the needle mostly dropped, true recall below 1, and below
  // the gate's estimate of it on some layer is allowed but not required; the oracle keeps the needle.
  const nlohmann::json none = run({"attention.k=0", "attention.local_blocks=0"});
  double kept = 0, rt = 0;
  for (const auto& l : none["layers"]) kept += l["needle_kept"].get<double>(), rt += l["recall_true_answer"].get<double>();
  EXPECT_LT(kept, 1.0);
  EXPECT_LT(rt, 1.9);
  EXPECT_GT(rt, 0.0);
}

TEST(TrueRecallInTraining, TheModelMeasuresSampledRowsAndTheLogRecordsThem) {
  // The model: recall_rows sampled rows per layer; every block kept -> true recall 1 on each,
  // anchors only -> below 1; none asked -> none measured.
  ModelDims d;
  d.n_layers = 2, d.d_model = 32, d.n_heads = 4, d.n_kv_heads = 2, d.head_dim = 8, d.ffn_dim = 48, d.vocab = 50;
  d.init_std = 0.5;
  Model<float> model(d);
  model.init(5);
  std::mt19937_64 rng(9);
  PackedBatch b;
  for (int L : {200, 77, 130}) {
    std::vector<uint32_t> seq(static_cast<size_t>(L));
    for (auto& t : seq) t = uint32_t(rng() % 50);
    b.add(seq);
  }
  AttnSettings a;
  a.sparse = true, a.block_size = 8, a.local_blocks = 1, a.theta = 1e9, a.k = {1000, 1000}, a.recall_rows = 7;
  MicroBatchStats all = model.forward(b, a);
  a.k = {0, 0}, a.local_blocks = 0, a.theta = 8;
  MicroBatchStats few = model.forward(b, a);
  a.recall_rows = 0;
  MicroBatchStats none = model.forward(b, a);
  for (int l = 0; l < 2; l++) {
    EXPECT_EQ(all.gating[size_t(l)].true_rows, 7);
    EXPECT_NEAR(all.gating[size_t(l)].true_recall_sum, 7.0, 1e-4);
    EXPECT_EQ(few.gating[size_t(l)].true_rows, 7);
    EXPECT_LT(few.gating[size_t(l)].true_recall_sum, 6.9);
    EXPECT_GT(few.gating[size_t(l)].true_recall_sum, 0.0);
    EXPECT_EQ(none.gating[size_t(l)].true_rows, 0);
  }
  // The same rows as recall_sample names, measured by the kernel directly (gating at k = 0 again).
  EXPECT_EQ(recall_sample(100, 5, 1, 407), recall_sample(100, 5, 1, 407));
  EXPECT_NE(recall_sample(100, 5, 0, 407), recall_sample(100, 5, 1, 407));
}

TEST(TrueRecallInTraining, TrainLogsTrueRecallBesideTheGatesOnTheStepsAsked) {
  const std::string dir = fresh_dir("train");
  const std::string data = sbtest::make_corpus(dir, 60, 600);
  const std::string cmd = sbtest::binary() + " train" + sbtest::tiny_flags(data, dir) +
                          " --set train.steps=4 --set attention.mode=sparse --set attention.k=1 --set balance.tuning=dst"
                          " --set balance.target=recall --set balance.self_profile=false --set balance.recall_rows=6"
                          " --set balance.recall_every=2 --set log.progress=true --summary " + dir + "/train.json";
  ASSERT_EQ(sbtest::sh(cmd, dir + "/train.log"), 0) << sbtest::slurp(dir + "/train.log");
  const MetricsTables t = read_metrics(dir + "/metrics.h5");
  ASSERT_EQ(t.steps.size(), 4u);
  for (const StepRow& r : t.steps) {
    if (r.step % 2 == 1) {  // steps 1, 3: measured (recall_every = 2 from the first step)
      EXPECT_GT(r.recall_true, 0.0) << "step " << r.step;
      EXPECT_LE(r.recall_true, 1.0) << "step " << r.step;
    } else {
      EXPECT_EQ(r.recall_true, -1.0) << "step " << r.step;
    }
    EXPECT_GT(r.recall, 0.0);
  }
  EXPECT_NE(sbtest::slurp(dir + "/train.log").find("true rec"), std::string::npos);
  const double mean_true = sbtest::read_json(dir + "/train.json")["mean_recall_true"].get<double>();
  EXPECT_NEAR(mean_true, (t.steps[0].recall_true + t.steps[2].recall_true) / 2, 1e-12);
}
