// `sparsebalance convert` end to end: HF -> checkpoint -> HF bit-exact in BF16, F16 and F32
// (sharded), refusals that leave nothing behind, eval on a converted checkpoint without a CONFIG,
// and the forward of imported models against transformers' logits (tests/convert/fixtures, made
// by bench/torch/hf_parity.py on the GPU machine: a model transformers built, and our own exports that
// transformers loaded); train --init-from.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "src/train/settings.hpp"
#include "src/hf/hf_config.hpp"
#include "src/train/weights.hpp"
#include "src/hf/hf_convert.hpp"
#include "tests/convert/convert_test_util.hpp"
#include "tests/error_of.hpp"

using namespace sb;
using json = nlohmann::json;
using sbtest::error_of;
using sbtest::fs::exists;

namespace {

sbtest::Run convert(const std::string& args) { return sbtest::run_program("convert " + args); }

// Same names, dtypes, shapes and bytes.
void expect_same_tensors(const std::string& a_dir, const std::string& b_dir) {
  SafetensorsDir a(a_dir), b(b_dir);
  ASSERT_EQ(a.names(), b.names());
  for (const auto& n : a.names()) {
    auto [fa, ta] = a.get(n);
    auto [fb, tb] = b.get(n);
    EXPECT_EQ(ta->dtype, tb->dtype) << n;
    EXPECT_EQ(ta->shape, tb->shape) << n;
    auto ba = fa->bytes(*ta), bb = fb->bytes(*tb);
    ASSERT_EQ(ba.size(), bb.size()) << n;
    EXPECT_EQ(std::memcmp(ba.data(), bb.data(), ba.size()), 0) << n << " differs";
  }
}

struct Loaded {
  Checkpoint ck;
  Config cfg;
  std::unique_ptr<Model<float>> model;
};

// The checkpoint and its stored config alone give the model (what eval does without a CONFIG).
Loaded load(const std::string& path) {
  Loaded l{read_checkpoint(path), Config(), nullptr};
  l.cfg = Config::from_text(l.ck.config_toml, path);
  l.model = std::make_unique<Model<float>>(model_dims(l.cfg, 0));
  load_weights(l.ck, path, *l.model);
  return l;
}

// Log-softmax of our logits at each position of each sequence, for the tokens v with
// v % stride == position % stride (NaN elsewhere: a sample, each value normalised over the whole
// vocabulary, kept small because every value costs a forward, slow under ASan). The
// model reports only the summed cross-entropy, so one forward per (position, token) with that
// single target gives -log p(token | prefix) as the model computes it. Dense attention.
std::vector<std::vector<std::vector<double>>> our_log_softmax(Model<float>& m, const json& ids, int stride) {
  PackedBatch b;
  for (const auto& seq : ids) b.add(seq.get<std::vector<uint32_t>>());
  AttnSettings a;
  a.sparse = false, a.block_size = 4;
  a.k.assign(m.shape().n_layers, 1);
  const int V = m.shape().vocab;
  std::vector<std::vector<std::vector<double>>> out;
  int t = 0;
  for (const auto& seq : ids) {
    out.emplace_back();
    for (size_t i = 0; i < seq.size(); ++i, ++t) {
      out.back().emplace_back(V, std::nan(""));
      for (int v = t % stride; v < V; v += stride) {
        std::fill(b.targets.begin(), b.targets.end(), -1);
        b.targets[t] = v;
        out.back().back()[v] = -m.forward(b, a).loss_sum;
      }
    }
  }
  return out;
}

// Our forward on checkpoint `ck` against transformers' logits (json "ids", "logits").
void expect_matches_transformers(const std::string& ck, const json& golden, int stride) {
  Loaded l = load(ck);
  auto ours = our_log_softmax(*l.model, golden["ids"], stride);
  const auto& logits = golden["logits"];
  ASSERT_EQ(ours.size(), logits.size());
  double worst = 0;
  int64_t n = 0;
  for (size_t s = 0; s < ours.size(); ++s)
    for (size_t t = 0; t < ours[s].size(); ++t) {
      const auto row = logits[s][t].get<std::vector<double>>();
      ASSERT_EQ(row.size(), ours[s][t].size());
      double mx = -1e300, sum = 0;
      for (double x : row) mx = std::max(mx, x);
      for (double x : row) sum += std::exp(x - mx);
      for (size_t v = 0; v < row.size(); ++v)
        if (!std::isnan(ours[s][t][v])) worst = std::max(worst, std::fabs(ours[s][t][v] - (row[v] - mx - std::log(sum)))), ++n;
    }
  EXPECT_GT(n, 0);
  std::printf("%s: %lld log-softmax values, largest difference from transformers %.2e\n", ck.c_str(),
              static_cast<long long>(n), worst);
  EXPECT_LT(worst, 1e-4) << ck << ": largest log-softmax difference from transformers";
}

// Every tensor of checkpoint `ck` equals the HF directory's (to 1e-9: one step at lr 1e-12).
void expect_holds_weights_of(const Checkpoint& ck, const std::string& hf) {
  SafetensorsDir st(hf);
  for (const auto& t : ck.tensors) {
    auto [f, e] = st.get(t.name);
    std::vector<float> want(e->numel());
    f->read_f32(*e, want);
    double worst = 0;
    for (size_t i = 0; i < t.size; ++i) worst = std::max(worst, std::fabs(double(want[i]) - ck.params[t.offset + i]));
    EXPECT_LT(worst, 1e-9) << t.name;
  }
}

}  // namespace

TEST(Convert, HfToCheckpointToHfIsBitExactInEachDtype) {
  sbtest::Scratch s;
  const std::string g = sbtest::gen_dir();
  struct Case { std::string src; StDtype dtype; uint64_t shard; bool sharded_out; };
  for (const Case& c : {Case{"llama_bf16", StDtype::BF16, kDefaultShardBytes, false},
                        Case{"mistral_f16", StDtype::F16, kDefaultShardBytes, false},
                        Case{"llama_f32_sharded", StDtype::F32, 60'000, true},
                        Case{"qwen2_bf16", StDtype::BF16, kDefaultShardBytes, false}}) {
    const std::string ck = s / (c.src + ".h5"), hf = s / (c.src + "_hf");
    EXPECT_NE(hf_to_checkpoint(g + "/" + c.src, ck, {}).find("step 0, zero AdamW moments"), std::string::npos);
    checkpoint_to_hf(ck, hf, c.dtype, c.shard, false);
    expect_same_tensors(g + "/" + c.src, hf);
    EXPECT_EQ(exists(hf + "/model.safetensors.index.json"), c.sharded_out) << c.src;
    EXPECT_FALSE(exists(hf + ".tmp"));
    // The checkpoint: step 0, zero moments, float32 parameters, the [model] keys of config.json.
    Checkpoint k = read_checkpoint(ck);
    EXPECT_EQ(k.step, 0);
    EXPECT_TRUE(std::all_of(k.m.begin(), k.m.end(), [](float x) { return x == 0; }));
    HfModel in = read_hf_config(g + "/" + c.src), out = read_hf_config(hf);
    const bool qwen = in.architecture == "Qwen2ForCausalLM";
    EXPECT_EQ(out.architecture, qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM") << c.src;
    EXPECT_EQ(out.qkv_bias, qwen) << c.src;
    EXPECT_EQ(Config::from_text(k.config_toml, ck).b("model.qkv_bias"), qwen) << c.src;
    EXPECT_EQ(out.dims.tied, in.dims.tied);
    EXPECT_EQ(out.dims.rope_theta, in.dims.rope_theta);
    EXPECT_EQ(out.dims.norm_eps, in.dims.norm_eps);
    EXPECT_EQ(out.max_position_embeddings, in.max_position_embeddings);
    const json cj = json::parse(sbtest::slurp(hf + "/config.json"));
    EXPECT_EQ(cj["torch_dtype"], c.dtype == StDtype::BF16 ? "bfloat16" : c.dtype == StDtype::F16 ? "float16" : "float32");
  }
  // An existing export is replaced only with overwrite.
  const std::string hf = s / "llama_bf16_hf";
  std::string e = error_of([&] { checkpoint_to_hf(s / "llama_bf16.h5", hf, StDtype::F32, kDefaultShardBytes, false); });
  EXPECT_NE(e.find("already exists"), std::string::npos) << e;
  checkpoint_to_hf(s / "llama_bf16.h5", hf, StDtype::F32, kDefaultShardBytes, true);
  EXPECT_EQ(SafetensorsDir(hf).get("model.norm.weight").second->dtype, StDtype::F32);
}

TEST(Convert, TheCommandRoundTripsAndRefuses) {
  sbtest::Scratch s;
  const std::string g = sbtest::gen_dir();
  auto r = convert(g + "/llama_bf16 " + s / "ck.h5");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = convert(s / "ck.h5" + " " + s / "hf");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("BF16: model.safetensors + config.json"), std::string::npos) << r.out;
  expect_same_tensors(g + "/llama_bf16", s / "hf");
  // A bare file name: the checkpoint in the working directory (no directory to create).
  r = sbtest::run_clean("cd " + sbtest::sh_quote(s / "hf") + " && " + sbtest::program() + " convert " +
                        sbtest::sh_quote(g + "/llama_bf16") + " bare.h5");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(exists(s / "hf/bare.h5"));
  r = convert(g + "/bad_dirs/rope_scaling " + s / "x.h5");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("config.json: field 'rope_scaling.low_freq_factor' is missing"), std::string::npos) << r.out;
  r = convert(g + "/llama_bf16 " + s / "x.h5 --dtype f16");
  EXPECT_NE(r.out.find("--dtype and --shard-size apply to checkpoint -> HF"), std::string::npos) << r.out;
  EXPECT_FALSE(exists(s / "x.h5"));
}

TEST(Convert, RefusalsNameTheProblemAndWriteNothing) {
  sbtest::Scratch s;
  const std::string g = sbtest::gen_dir();
  const std::vector<std::pair<std::string, std::string>> dirs = {
      {"missing", "model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' is missing"},
      {"unexpected", "model.safetensors: unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"},
      {"shape", "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 16], config.json gives [16, 32]"},
      {"damaged", "model.safetensors: tensor 'lm_head.weight': data_offsets"},
      {"rope_scaling", "config.json: field 'rope_scaling.low_freq_factor' is missing (rope_type \"llama3\" requires it)"},
      {"index_missing", "tensor 'model.layers.9.mlp.up_proj.weight' is missing"},
      {"attention_bias", "config.json: field 'attention_bias' = true (biases on q/k/v and o_proj)"},
      {"mlp_bias", "config.json: field 'mlp_bias' = true"},
      {"qwen2_o_bias", "model.safetensors: unexpected tensor 'model.layers.1.self_attn.o_proj.bias'"},
      {"qwen2_sliding", "config.json: field 'use_sliding_window' = true"},
  };
  for (const auto& [dir, msg] : dirs) {
    const std::string dst = s / (dir + ".h5");
    std::string e = error_of([&] { hf_to_checkpoint(g + "/bad_dirs/" + dir, dst, {}); });
    EXPECT_NE(e.find(msg), std::string::npos) << dir << ": " << e;
    EXPECT_FALSE(exists(dst)) << dir;
    EXPECT_FALSE(exists(dst + ".tmp")) << dir;
  }
  // An existing checkpoint is not replaced without overwrite.
  hf_to_checkpoint(g + "/llama_bf16", s / "ok.h5", {});
  const std::string before = sbtest::slurp(s / "ok.h5");
  std::string e = error_of([&] { hf_to_checkpoint(g + "/mistral_f16", s / "ok.h5", {}); });
  EXPECT_NE(e.find("ok.h5: already exists; choose another DST or pass --overwrite"), std::string::npos) << e;
  EXPECT_EQ(sbtest::slurp(s / "ok.h5"), before);
  hf_to_checkpoint(g + "/mistral_f16", s / "ok.h5", {}, true);
  EXPECT_TRUE(read_checkpoint(s / "ok.h5").tensors.size() < 21);  // tied: no lm_head
  // float16 cannot hold the sharded fixture's 3.4e38: named, nothing exported.
  hf_to_checkpoint(g + "/llama_f32_sharded", s / "big.h5", {});
  e = error_of([&] { checkpoint_to_hf(s / "big.h5", s / "big_hf", StDtype::F16, kDefaultShardBytes, false); });
  EXPECT_NE(e.find("tensor 'model.embed_tokens.weight' holds"), std::string::npos) << e;
  EXPECT_NE(e.find("beyond float16's range"), std::string::npos) << e;
  EXPECT_FALSE(exists(s / "big_hf"));
  EXPECT_FALSE(exists(s / "big_hf.tmp"));
  // A checkpoint whose stored [model] keys do not describe its tensors is not exported.
  Checkpoint lie = read_checkpoint(s / "big.h5");
  Config stored = Config::from_text(lie.config_toml, "stored");
  stored.set("model.n_layers", "3", "test");
  lie.config_toml = stored.to_toml();
  write_checkpoint(s / "lie.h5", lie);
  e = error_of([&] { checkpoint_to_hf(s / "lie.h5", s / "lie_hf", StDtype::BF16, kDefaultShardBytes, false); });
  EXPECT_NE(e.find("holds 21 tensors, its stored [model] settings give 30"), std::string::npos) << e;
  EXPECT_FALSE(exists(s / "lie_hf"));
  e = error_of([&] { hf_to_checkpoint(g + "/llama_bf16", s / "x.h5", {"model.n_layers=3"}); });
  EXPECT_NE(e.find("--set model.n_layers=3: the [model] keys come from"), std::string::npos) << e;
  EXPECT_FALSE(exists(s / "x.h5"));
}

TEST(Convert, EvalOnTheConvertedCheckpointNeedsNoConfig) {
  sbtest::Scratch s;
  hf_to_checkpoint(sbtest::gen_dir() + "/llama_bf16", s / "ck.h5", {"data.path=" + sbtest::synth_data()});
  auto r = sbtest::run_program("eval --checkpoint " + s / "ck.h5" + " --set eval.docs=4 --summary " + s / "eval.json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(sbtest::slurp(s / "eval.json"));
  EXPECT_EQ(j["step"], 0);
  EXPECT_GT(j["tokens"].get<int64_t>(), 0);
  EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
}

TEST(Parity, ImportedTransformersModelGivesItsLogits) {
  // LlamaForCausalLM from transformers (float32, untied, rope_theta 50000, GQA, random norms).
  sbtest::Scratch s;
  const std::string fx = sbtest::committed("llama");
  hf_to_checkpoint(fx, s / "ck.h5", {});
  expect_matches_transformers(s / "ck.h5", json::parse(sbtest::slurp(fx + "/golden.json")), 5);
  // And back out in float32: the same tensors, bit for bit.
  checkpoint_to_hf(s / "ck.h5", s / "hf", StDtype::F32, kDefaultShardBytes, false);
  expect_same_tensors(fx, s / "hf");
}

TEST(Parity, ImportedTransformersQwen2AndMistralGiveTheirLogits) {
  // Qwen2ForCausalLM (tied, random q/k/v biases and norms) and MistralForCausalLM (tied,
  // sliding_window null) from transformers in float32; both back out bit for bit in float32.
  sbtest::Scratch s;
  for (const std::string name : {"qwen2", "mistral"}) {
    const std::string fx = sbtest::committed(name);
    hf_to_checkpoint(fx, s / (name + ".h5"), {});
    expect_matches_transformers(s / (name + ".h5"), json::parse(sbtest::slurp(fx + "/golden.json")), 5);
    checkpoint_to_hf(s / (name + ".h5"), s / (name + "_hf"), StDtype::F32, kDefaultShardBytes, false);
    expect_same_tensors(fx, s / (name + "_hf"));
  }
}

TEST(Parity, ScaledRopeAndQwen3FixturesGiveTheirLogits) {
  // bench/torch/hf_rope_reference.py's fixtures (transformers' formulas in plain torch, float64; the GPU
  // machine cross-checks them with transformers, bench/torch/hf_fixtures.sh): Llama 3.1-style llama3
  // scaling, Qwen2 with YaRN (attention factor 1.139), Qwen3 (head_dim 16 beside hidden 32 / 4 heads,
  // q_norm / k_norm, linear scaling under transformers 5's rope_parameters). Their sequences (56 and
  // 35 tokens) run past original_max_position_embeddings (32). Imported, our forward gives their
  // logits; exported in float32, the same tensors bit for bit and the same config fields.
  sbtest::Scratch s;
  for (const std::string name : {"llama31", "qwen2_yarn", "qwen3"}) {
    const std::string fx = sbtest::committed(name);
    hf_to_checkpoint(fx, s / (name + ".h5"), {});
    expect_matches_transformers(s / (name + ".h5"), json::parse(sbtest::slurp(fx + "/golden.json")), 23);
    checkpoint_to_hf(s / (name + ".h5"), s / (name + "_hf"), StDtype::F32, kDefaultShardBytes, false);
    expect_same_tensors(fx, s / (name + "_hf"));
    const json in = json::parse(sbtest::slurp(fx + "/config.json"));
    const json out = json::parse(sbtest::slurp(s / (name + "_hf") + "/config.json"));
    for (const char* f : {"architectures", "model_type", "head_dim", "hidden_size", "num_attention_heads",
                          "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings"})
      if (in.contains(f)) EXPECT_EQ(out[f], in[f]) << name << ": " << f;
    const char* field = in.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
    ASSERT_TRUE(out.contains(field)) << name;
    for (auto& [k, v] : in[field].items())  // every field given comes back ("type" as rope_type)
      EXPECT_EQ(out[field][k == "type" ? "rope_type" : k], v) << name << ": " << field << "." << k;
    HfModel a = parse_hf_config(in.dump(), "in"), b = parse_hf_config(out.dump(), "out");
    EXPECT_TRUE(a.dims.rope_scaling == b.dims.rope_scaling) << name;
    EXPECT_EQ(a.dims.qk_norm, b.dims.qk_norm);
    EXPECT_EQ(a.architecture, b.architecture);
  }
}

TEST(Parity, ScaledRopeChangesTheLogitsOnlyPastTheOriginalContext) {
  // The same Llama 3.1 fixture with its scaling removed: the logits move (the test above could not
  // pass by ignoring the scaling), and a run may set its own scaling over --init-from's.
  sbtest::Scratch s;
  const std::string fx = sbtest::committed("llama31");
  sbtest::fs::create_directories(s / "plain");
  sbtest::fs::copy_file(fx + "/model.safetensors", s / "plain/model.safetensors");
  json cfg = json::parse(sbtest::slurp(fx + "/config.json"));
  cfg["rope_scaling"] = nullptr;
  {
    std::ofstream(s / "plain/config.json") << cfg.dump();
  }
  hf_to_checkpoint(s / "plain", s / "plain.h5", {});
  Loaded l = load(s / "plain.h5");
  const json golden = json::parse(sbtest::slurp(fx + "/golden.json"));
  auto ours = our_log_softmax(*l.model, golden["ids"], 31);
  double moved = 0;
  for (size_t t = 0; t < ours[0].size(); ++t) {
    const auto row = golden["logits"][0][t].get<std::vector<double>>();
    double mx = -1e300, sum = 0;
    for (double x : row) mx = std::max(mx, x);
    for (double x : row) sum += std::exp(x - mx);
    for (size_t v = 0; v < row.size(); ++v)
      if (!std::isnan(ours[0][t][v])) moved = std::max(moved, std::fabs(ours[0][t][v] - (row[v] - mx - std::log(sum))));
  }
  EXPECT_GT(moved, 1e-2) << "plain RoPE should not give the llama3-scaled logits";
  // --init-from the plain directory with the scaling set for the run: the run's keys stand.
  Config run = Config::load("", std::vector<std::string>{"model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
                                                         "model.rope_scaling.original_max_position_embeddings=32"});
  std::vector<std::string> notes;
  init_weights_from(s / "plain", run, {}, &notes);
  const ModelDims d = model_dims(run, 0);
  EXPECT_EQ(d.rope_scaling.type, "llama3");
  EXPECT_EQ(d.rope_scaling.factor, 8);
  EXPECT_EQ(d.rope_scaling.original_max_positions, 32);
  // Without its own, the run takes PATH's scaling.
  Config run2;
  init_weights_from(fx, run2, {}, nullptr);
  EXPECT_EQ(model_dims(run2, 0).rope_scaling.type, "llama3");
  EXPECT_EQ(model_dims(run2, 0).rope_scaling.original_max_positions, 32);
}

TEST(Parity, TransformersLoadsOurExportsAndAgrees) {
  // bench/torch/hf_parity.py --check loaded these exports (BF16 untied; F16 tied, from a Mistral
  // directory; BF16 of transformers' Qwen2 (as Qwen2ForCausalLM, biases included) and Mistral,
  // bench/torch/hf_fixtures.sh) with no missing, unexpected or mismatched keys and saved its logits.
  sbtest::Scratch s;
  for (const std::string name : {"exp_llama_bf16", "exp_mistral_f16", "exp_qwen2_bf16", "exp_mistral_bf16"}) {
    const std::string fx = sbtest::committed(name);
    json golden = json::parse(sbtest::slurp(fx + "/transformers_logits.json"));
    for (auto& [k, v] : golden["loading_info"].items()) EXPECT_TRUE(v.empty()) << name << ": " << k;
    hf_to_checkpoint(fx, s / (name + ".h5"), {});
    expect_matches_transformers(s / (name + ".h5"), golden, 24);
  }
}

TEST(InitFrom, TrainStartsFromTheWeightsWithTheShapeOfPath) {
  sbtest::Scratch s;
  const std::string hf = sbtest::gen_dir() + "/llama_bf16";
  // One step at the smallest learning rate moves a weight by about 1e-12: the step-1 checkpoint
  // holds the HF weights (a random init would differ by about 0.1).
  // Two ranks: each reads PATH; the step's sync check would catch ranks that disagree.
  auto r = sbtest::run_clean("mpirun --allow-run-as-root --oversubscribe -np 2 " + sbtest::program() +
                             " train --init-from " + hf + " --set data.path=" + sbtest::synth_data() +
                          " --set train.steps=1 --set train.lr=1e-12 --set balance.self_profile=false --set train.sync_check_every=1"
                          " --set train.micro_batch_tokens=512 --set train.global_batch_tokens=512 --set checkpoint.dir=" +
                          s / "ck" + " --set log.path=" + s / "m.h5");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("train: 2 rank(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fresh optimizer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vocab 320"), std::string::npos) << r.out;
  expect_holds_weights_of(read_checkpoint(s / "ck/ckpt_00000001.h5"), hf);
  // In process: from a checkpoint too; a --set model.* must agree with PATH.
  hf_to_checkpoint(hf, s / "init.h5", {});
  Config cfg;
  cfg.set("model.n_layers", "5", "test");
  std::vector<std::string> notes;
  std::vector<float> w = init_weights_from(s / "init.h5", cfg, {"model.d_model=32", "train.steps=3"}, &notes);
  EXPECT_EQ(w, read_checkpoint(s / "init.h5").params);
  EXPECT_EQ(cfg.i("model.n_layers"), 2);
  EXPECT_EQ(cfg.i("model.vocab_size"), 320);
  EXPECT_FALSE(cfg.b("model.tie_embeddings"));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("model.n_layers = 5 replaced by 2"), std::string::npos) << notes[0];
  std::string e = error_of([&] { Config c; init_weights_from(hf, c, {"model.n_layers=3"}); });
  EXPECT_NE(e.find("--set model.n_layers=3 contradicts --init-from " + hf + ", which has model.n_layers = 2"),
            std::string::npos) << e;
  e = error_of([&] { Config c; init_weights_from(sbtest::gen_dir() + "/bad_dirs/rope_scaling", c, {}); });
  EXPECT_NE(e.find("field 'rope_scaling.low_freq_factor' is missing"), std::string::npos) << e;
}

TEST(InitFrom, AQwen2DirectoryBringsItsBiases) {
  // Qwen2 (tied, q/k/v biases, Qwen2.5's config fields): train starts from its weights, biases
  // included, and exports them again.
  sbtest::Scratch s;
  const std::string hf = sbtest::gen_dir() + "/qwen2_bf16";
  auto r = sbtest::run_program("train --init-from " + hf + " --set data.path=" + sbtest::synth_data() +
                               " --set train.steps=1 --set train.lr=1e-12 --set balance.self_profile=false"
                               " --set train.micro_batch_tokens=512 --set train.global_batch_tokens=512 --set checkpoint.dir=" +
                               s / "ck" + " --set log.path=" + s / "m.h5 --set log.batches=" + s / "b.jsonl");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("fresh optimizer"), std::string::npos) << r.out;
  // log.batches (bench/torch/torch_trajectory.py reads it): the step's segments, whose trained targets
  // are the step's target count, each the next token of its segment.
  const json bl = json::parse(sbtest::slurp(s / "b.jsonl"));
  EXPECT_EQ(bl["step"], 1);
  int64_t targets = 0, tokens = 0;
  for (const auto& seg : bl["segments"]) {
    const auto tok = seg["tokens"].get<std::vector<int64_t>>(), tg = seg["targets"].get<std::vector<int64_t>>();
    ASSERT_EQ(tok.size(), tg.size());
    for (size_t i = 0; i + 1 < tok.size(); ++i) EXPECT_EQ(tg[i], tok[i + 1]);
    EXPECT_EQ(tg.back(), -1);
    targets += int64_t(tok.size()) - 1, tokens += int64_t(tok.size());
  }
  EXPECT_EQ(bl["targets"].get<int64_t>(), targets);
  EXPECT_GE(tokens, 512);
  Checkpoint ck = read_checkpoint(s / "ck/ckpt_00000001.h5");
  EXPECT_TRUE(Config::from_text(ck.config_toml, "ck").b("model.qkv_bias"));
  expect_holds_weights_of(ck, hf);
  SafetensorsDir st(hf);
  int biases = 0;
  for (const auto& t : ck.tensors) biases += t.name.ends_with("_proj.bias");
  EXPECT_EQ(biases, 6);  // q, k, v in each of 2 layers
  EXPECT_EQ(ck.tensors.size(), st.names().size());
  // The trained checkpoint exports as Qwen2 with its biases.
  checkpoint_to_hf(s / "ck/ckpt_00000001.h5", s / "out", StDtype::BF16, kDefaultShardBytes, false);
  EXPECT_EQ(read_hf_config(s / "out").architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(SafetensorsDir(s / "out").names(), st.names());
  // model.qkv_bias comes from PATH too.
  std::string e = error_of([&] { Config c; init_weights_from(hf, c, {"model.qkv_bias=false"}); });
  EXPECT_NE(e.find("--set model.qkv_bias=false contradicts --init-from " + hf + ", which has model.qkv_bias = true"),
            std::string::npos) << e;
}

// LoRA (src/model/README.md "LoRA"): adapters on the frozen Qwen2 fixture (tied, q/k/v biases), the
// embedding and norms trained beside them; resume bit-exact; the PEFT adapter read back; the merged
// export equal to base + (alpha / rank) B A; a mismatched base refused naming both.
TEST(Lora, TrainResumeExportAndMerge) {
  namespace fs = std::filesystem;
  sbtest::Scratch s;
  const std::string hf = sbtest::gen_dir() + "/qwen2_bf16";
  const std::string flags = " --init-from " + hf + " --set data.path=" + sbtest::synth_data() +
                            " --set train.steps=4 --set checkpoint.every=2 --set train.lr=1e-2 --set balance.self_profile=false"
                            " --set train.micro_batch_tokens=512 --set train.global_batch_tokens=512"
                            " --set lora.rank=4 --set lora.alpha=6 --set lora.targets=q,v,o,down --set lora.train_also=embed,norm"
                            " --set lora.dropout=0.25";  // resumed, the same draws (kernels/lora_dropout.hpp)
  auto r = sbtest::run_program("train" + flags + " --set checkpoint.dir=" + s / "ck" + " --set log.path=" + s / "m.h5");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("init-from: the frozen base of the LoRA adapters is "), std::string::npos) << r.out;
  const Checkpoint ck = read_checkpoint(s / "ck/ckpt_00000004.h5");
  // resumed at step 2 in another directory: steps 3, 4 give the same weights and moments, bit for bit
  fs::create_directories(s / "ck2");
  fs::copy_file(s / "ck/ckpt_00000002.h5", s / "ck2/ckpt_00000002.h5");
  r = sbtest::run_program("train" + flags + " --resume --set checkpoint.dir=" + s / "ck2" + " --set log.path=" + s / "m2.h5");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Checkpoint ck2 = read_checkpoint(s / "ck2/ckpt_00000004.h5");
  EXPECT_TRUE(ck2.params == ck.params && ck2.m == ck.m && ck2.v == ck.v) << "LoRA resume is not bit-exact";

  // the PEFT adapter: PEFT's names, our values (f32), the tied head given the trained embedding
  r = sbtest::run_program("convert " + s / "ck/ckpt_00000004.h5 " + s / "peft");
  ASSERT_EQ(r.rc, 0) << r.out;
  SafetensorsFile ad(s / "peft/adapter_model.safetensors");
  ASSERT_EQ(ad.tensors().size(), ck.tensors.size() + 1);
  auto values = [](const SafetensorsFile& f, const std::string& name) {
    const StTensor* t = f.find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> v(t ? t->numel() : 0);
    if (t) f.read_f32(*t, v);
    return v;
  };
  for (const auto& t : ck.tensors)
    EXPECT_EQ(values(ad, "base_model.model." + t.name),
              std::vector<float>(ck.params.begin() + long(t.offset), ck.params.begin() + long(t.offset + t.size)))
        << t.name;
  EXPECT_EQ(values(ad, "base_model.model.lm_head.weight"), values(ad, "base_model.model.model.embed_tokens.weight"));
  const json ac = json::parse(sbtest::slurp(s / "peft/adapter_config.json"));
  EXPECT_EQ(ac["r"], 4);
  EXPECT_EQ(ac["lora_alpha"], 6.0);
  EXPECT_EQ(ac["lora_dropout"], 0.25);
  EXPECT_EQ(ac["target_modules"], json({"q_proj", "v_proj", "o_proj", "down_proj"}));
  EXPECT_EQ(ac["modules_to_save"], json({"embed_tokens", "lm_head", "input_layernorm", "post_attention_layernorm", "norm"}));

  // merged: W + (6 / 4) B A on the targets, the base elsewhere, the trained embedding and norms
  r = sbtest::run_program("convert " + s / "ck/ckpt_00000004.h5 " + s / "merged --merge --dtype f32");
  ASSERT_EQ(r.rc, 0) << r.out;
  SafetensorsFile mg(s / "merged/model.safetensors");
  SafetensorsDir base(hf);
  auto base_values = [&](const std::string& name) {
    auto [f, t] = base.get(name);
    std::vector<float> v(t->numel());
    f->read_f32(*t, v);
    return v;
  };
  const std::string q = "model.layers.1.self_attn.q_proj.";
  const std::vector<float> W = base_values(q + "weight"), A = values(ad, "base_model.model." + q + "lora_A.weight"),
                           B = values(ad, "base_model.model." + q + "lora_B.weight"), M = values(mg, q + "weight");
  const size_t out = B.size() / 4, in = A.size() / 4;
  ASSERT_EQ(M.size(), out * in);
  double worst = 0, moved = 0;
  for (size_t i = 0; i < out; ++i)
    for (size_t j = 0; j < in; ++j) {
      double want = W[i * in + j];
      for (size_t k = 0; k < 4; ++k) want += 1.5 * double(B[i * 4 + k]) * double(A[k * in + j]);
      worst = std::max(worst, std::abs(M[i * in + j] - want));
      moved = std::max(moved, std::abs(M[i * in + j] - double(W[i * in + j])));
    }
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(moved, 1e-4) << "the adapters did not move the merged weight: the check above is empty";
  EXPECT_EQ(values(mg, "model.layers.0.self_attn.k_proj.weight"), base_values("model.layers.0.self_attn.k_proj.weight"));
  EXPECT_EQ(values(mg, "model.layers.0.self_attn.q_proj.bias"), base_values("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_EQ(values(mg, "model.norm.weight"), values(ad, "base_model.model.model.norm.weight"));
  EXPECT_EQ(values(mg, "model.embed_tokens.weight"), values(ad, "base_model.model.model.embed_tokens.weight"));

  // --init-from the adapter directory: its base (base_model_name_or_path) and its adapters; one step
  // at the smallest learning rate keeps them (a fresh init would differ by about 0.1)
  const std::string one = " --set data.path=" + sbtest::synth_data() + " --set train.steps=1 --set train.lr=1e-12"
                          " --set balance.self_profile=false --set train.micro_batch_tokens=512 --set train.global_batch_tokens=512"
                          " --set lora.rank=4 --set lora.targets=q,v,o,down --set lora.train_also=embed,norm --set log.path=" + s / "m4.h5";
  r = sbtest::run_program("train --init-from " + s / "peft" + one + " --set lora.alpha=6 --set checkpoint.dir=" + s / "ck3");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("init-from: the LoRA adapters of " + s / "peft"), std::string::npos) << r.out;
  const Checkpoint ck3 = read_checkpoint(s / "ck3/ckpt_00000001.h5");
  ASSERT_EQ(ck3.params.size(), ck.params.size());
  for (size_t i = 0; i < ck.params.size(); ++i) ASSERT_NEAR(ck3.params[i], ck.params[i], 1e-6) << i;
  r = sbtest::run_program("train --init-from " + s / "peft" + one + " --set lora.alpha=5 --set checkpoint.dir=" + s / "ck4");
  EXPECT_NE(r.out.find("lora_alpha = 6.000000, but lora.alpha = 5.000000"), std::string::npos) << r.out;

  // eval of the LoRA checkpoint: merged onto its base, the same loss as the merged export's checkpoint
  r = sbtest::run_program("eval --checkpoint " + s / "ck/ckpt_00000004.h5 --set data.path=" + sbtest::synth_data());
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("merged onto its base " + fs::absolute(hf).lexically_normal().string()), std::string::npos) << r.out;
  hf_to_checkpoint(s / "merged", s / "merged.h5", {"data.path=" + sbtest::synth_data()});
  auto r2 = sbtest::run_program("eval --checkpoint " + s / "merged.h5");
  ASSERT_EQ(r2.rc, 0) << r2.out;
  auto loss = [](const std::string& out) { return out.substr(out.find("loss dense"), 40); };
  EXPECT_EQ(loss(r.out), loss(r2.out));

  // another base of the same shape: refused, naming both
  hf_to_checkpoint(hf, s / "other.h5", {});
  Checkpoint o = read_checkpoint(s / "other.h5");
  o.params[7] += 0.5f;
  write_checkpoint(s / "other.h5", o);
  std::string e = error_of([&] {
    checkpoint_to_hf(s / "ck/ckpt_00000004.h5", s / "m2", StDtype::F32, kDefaultShardBytes, false, true, s / "other.h5");
  });
  EXPECT_NE(e.find("base mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find(fs::absolute(hf).lexically_normal().string()), std::string::npos) << e;
  EXPECT_NE(e.find(s / "other.h5"), std::string::npos) << e;
  r = sbtest::run_program("train" + flags + " --resume --set checkpoint.dir=" + s / "ck2" + " --set train.steps=5 --set log.path=" +
                          s / "m3.h5 --init-from " + s / "other.h5");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("trained LoRA adapters on the base " + fs::absolute(hf).lexically_normal().string()),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("this run's base is " + s / "other.h5"), std::string::npos) << r.out;
  // --merge of a full checkpoint, a LoRA checkpoint without --merge through the API: refused by name
  e = error_of([&] { checkpoint_to_hf(s / "other.h5", s / "m3", StDtype::F32, kDefaultShardBytes, false, true); });
  EXPECT_NE(e.find("--merge"), std::string::npos) << e;
  e = error_of([&] { checkpoint_to_hf(s / "ck/ckpt_00000004.h5", s / "m3", StDtype::F32, kDefaultShardBytes, false); });
  EXPECT_NE(e.find("a LoRA checkpoint"), std::string::npos) << e;
}
