// io/safetensors and src/model/hf without the CLI: half-precision conversions (exhaustively),
// good and damaged files refused naming the file and the tensor, the writer with sharding, and
// config.json parsing: real Qwen2.5 and transformers configs pass, unsupported fields are named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"
#include "src/hf/hf_config.hpp"
#include "src/train/settings.hpp"
#include "tests/convert/convert_test_util.hpp"
#include "tests/error_of.hpp"

using namespace sb;
using sbtest::error_of;
using json = nlohmann::json;

TEST(Dtypes, HalfTypesRoundTripEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float b = bf16_to_f32(uint16_t(h)), f = f16_to_f32(uint16_t(h));
    if (std::isnan(b)) EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(b))));
    else ASSERT_EQ(f32_to_bf16(b), h) << "bf16 " << h;
    if (std::isnan(f)) EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
    else ASSERT_EQ(f32_to_f16(f), h) << "f16 " << h;
  }
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // past the largest half: inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  // Narrowing rounds to nearest, ties to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);      // tie, even stays
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);      // tie, rounds up to even
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -26)), 0x0001);   // 0.75 of the smallest subnormal
}

TEST(Reader, GoodFile) {
  SafetensorsFile f(sbtest::gen_dir() + "/good.safetensors");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const StTensor* a = f.find("a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->dtype, StDtype::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> v(6);
  f.read_f32(*a, v);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], float(i));
  std::vector<float> b(4);
  f.read_f32(*f.find("b"), b);
  EXPECT_EQ(b, std::vector<float>(4, 1.0f));
  EXPECT_EQ(f.find("c"), nullptr);
}

TEST(Reader, DamagedFilesAreRefusedNamingFileAndTensor) {
  const std::map<std::string, std::vector<std::string>> want = {
      {"short", {"truncated: 5 bytes"}},
      {"truncated", {"tensor 'b'", "outside the data section", "truncated"}},
      {"header_past_end", {"header length 1048576 runs past the end of the file"}},
      {"bad_json", {"JSON header does not parse"}},
      {"overlap", {"tensor 'b' overlaps tensor 'a'"}},
      {"out_of_range", {"tensor 'b'", "data_offsets [24, 40] outside the data section of 32 bytes"}},
      {"size_mismatch", {"tensor 'a'", "24 bytes for dtype F32", "needs 32"}},
      {"unknown_dtype", {"tensor 'b'", "dtype 'F64' is not supported"}},
      {"not_object", {"tensor 'b'", "expected {"}},
  };
  for (const auto& [name, parts] : want) {
    const std::string path = sbtest::gen_dir() + "/bad_files/" + name + ".safetensors";
    std::string err = error_of([&] { SafetensorsFile f(path); });
    ASSERT_NE(err, "") << name << " was accepted";
    EXPECT_NE(err.find(path), std::string::npos) << name << ": " << err;
    for (const auto& p : parts) EXPECT_NE(err.find(p), std::string::npos) << name << ": " << err;
  }
}

TEST(Reader, DirectoriesCheckTheIndexAgainstTheShards) {
  const std::string g = sbtest::gen_dir();
  SafetensorsDir sharded(g + "/llama_f32_sharded");
  EXPECT_EQ(sharded.names().size(), 21u);  // embed, 2 x 9, norm, head
  EXPECT_TRUE(sharded.has("lm_head.weight"));
  std::string e = error_of([&] { SafetensorsDir d(g + "/bad_dirs/index_missing"); });
  EXPECT_NE(e.find("model-00001-of-00002.safetensors: tensor 'model.layers.9.mlp.up_proj.weight' is missing"), std::string::npos) << e;
  e = error_of([&] { SafetensorsDir d(g + "/bad_dirs/index_unlisted"); });
  EXPECT_NE(e.find("unexpected tensor 'model.norm.weight'"), std::string::npos) << e;
  e = error_of([&] { SafetensorsDir d(g + "/bad_dirs"); });
  EXPECT_NE(e.find("no model.safetensors or model.safetensors.index.json"), std::string::npos) << e;
}

TEST(Writer, EveryDtypeAndSharding) {
  sbtest::Scratch s;
  std::vector<float> a(300), b(50);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 64) * 0.25f - 7;  // exact in bf16 and f16
  for (size_t i = 0; i < b.size(); ++i) b[i] = -float(i);
  const std::vector<StOut> ts = {{"x.a", {3, 100}, a}, {"x.b", {50}, b}, {"x.c", {10, 5}, b}};
  for (StDtype dt : {StDtype::F32, StDtype::F16, StDtype::BF16}) {
    for (uint64_t shard : {uint64_t(1) << 30, uint64_t(400)}) {
      const std::string dir = s / (std::string(st_dtype_name(dt)) + std::to_string(shard));
      sbtest::fs::create_directories(dir);
      auto files = write_safetensors_dir(dir, ts, dt, shard);
      const bool sharded = shard == 400;
      // x.a alone is past 400 bytes: a shard of its own, then x.b + x.c, and the index.
      EXPECT_EQ(files.size(), sharded ? 3u : 1u) << st_dtype_name(dt);
      EXPECT_EQ(sbtest::fs::exists(dir + "/model.safetensors.index.json"), sharded);
      for (const auto& e : sbtest::fs::directory_iterator(dir))
        EXPECT_EQ(e.path().extension(), e.path().filename() == "model.safetensors.index.json" ? ".json" : ".safetensors");
      SafetensorsDir d(dir);
      for (const auto& t : ts) {
        auto [f, st] = d.get(t.name);
        EXPECT_EQ(st->dtype, dt);
        EXPECT_EQ(st->shape, t.shape);
        std::vector<float> back(st->numel());
        f->read_f32(*st, back);
        EXPECT_TRUE(std::equal(back.begin(), back.end(), t.data.begin())) << t.name;
        EXPECT_EQ(f->metadata().at("format"), "pt");
      }
    }
  }
}

// The config.json of Qwen/Qwen2.5-0.5B as published (Qwen2.5-3B differs only in sizes).
static json qwen25_config() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

static json llama_config() {
  json j = qwen25_config();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j.erase("sliding_window"), j.erase("use_sliding_window"), j.erase("max_window_layers");
  return j;
}

TEST(HfConfig, RealQwen25ConfigParsesWithItsBiases) {
  HfModel hf = parse_hf_config(qwen25_config().dump(), "qwen/config.json");
  EXPECT_EQ(hf.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(hf.qkv_bias);
  EXPECT_EQ(hf.dims.d_model, 896);
  EXPECT_EQ(hf.dims.n_heads, 14);
  EXPECT_EQ(hf.dims.n_kv_heads, 2);
  EXPECT_EQ(hf.dims.head_dim, 64);
  EXPECT_EQ(hf.dims.vocab, 151936);
  EXPECT_TRUE(hf.dims.tied);
  EXPECT_EQ(hf.dims.rope_theta, 1e6);
  EXPECT_EQ(hf.dims.norm_eps, 1e-6);
  EXPECT_EQ(hf.max_position_embeddings, 32768);
  Config qc;
  set_model_keys(hf, qc, "qwen/config.json");
  EXPECT_TRUE(qc.b("model.qkv_bias"));
  EXPECT_EQ(model_dims(qc, 0).num_params(), 494032768);  // Qwen2.5-0.5B's published parameter count
  // Exported back: Qwen2ForCausalLM, full attention, and it parses to the same shape.
  const json out = json::parse(hf_config_json(qc, model_dims(qc, 0), "bfloat16"));
  EXPECT_EQ(out["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(out["use_sliding_window"], false);
  EXPECT_FALSE(out.contains("attention_bias"));
  HfModel back = parse_hf_config(out.dump(), "exported");
  EXPECT_TRUE(back.qkv_bias);
  EXPECT_EQ(back.dims.d_model, 896);
  EXPECT_EQ(back.dims.rope_theta, 1e6);
  // The same shape as Llama has no biases, and its [model] keys are exactly config.json's.
  HfModel l = parse_hf_config(llama_config().dump(), "llama/config.json");
  EXPECT_FALSE(l.qkv_bias);
  Config cfg;
  set_model_keys(l, cfg, "llama/config.json");
  EXPECT_EQ(cfg.i("model.d_model"), 896);
  EXPECT_EQ(cfg.i("model.ffn_dim"), 4864);
  EXPECT_EQ(cfg.i("model.vocab_size"), 151936);
  EXPECT_EQ(cfg.f("model.rope_theta"), 1e6);
  EXPECT_EQ(cfg.f("model.norm_eps"), 1e-6);
  EXPECT_TRUE(cfg.b("model.tie_embeddings"));
  EXPECT_FALSE(cfg.b("model.qkv_bias"));
  EXPECT_EQ(cfg.i("model.max_position_embeddings"), 32768);
  // Through the checkpoint's stored text and back: the stored config keeps every digit.
  Config again = Config::from_text(cfg.to_toml(), "stored");
  EXPECT_EQ(again.f("model.norm_eps"), 1e-6);
  EXPECT_EQ(again.f("model.rope_theta"), 1e6);
}

TEST(HfConfig, TransformersConfigsPass) {
  // transformers 5 writes rope_parameters and "dtype"; this one came from bench/torch/hf_parity.py.
  HfModel m = read_hf_config(sbtest::committed("llama"));
  EXPECT_EQ(m.dims.rope_theta, 50000.0);
  EXPECT_FALSE(m.dims.tied);
  json mistral = json::parse(sbtest::slurp(sbtest::committed("transformers_mistral_config.json")));
  HfModel mm = parse_hf_config(mistral.dump(), "mistral");
  EXPECT_EQ(mm.architecture, "MistralForCausalLM");
  EXPECT_TRUE(mm.dims.tied);
  // What we export parses back to the same shape.
  Config cfg;
  set_model_keys(m, cfg, "llama");
  HfModel back = parse_hf_config(hf_config_json(cfg, m.dims, "bfloat16"), "exported");
  EXPECT_EQ(back.dims.d_model, m.dims.d_model);
  EXPECT_EQ(back.dims.rope_theta, m.dims.rope_theta);
  EXPECT_EQ(back.dims.norm_eps, m.dims.norm_eps);
  EXPECT_EQ(back.dims.tied, m.dims.tied);
  EXPECT_EQ(back.max_position_embeddings, 256);
}

TEST(HfConfig, UnsupportedFieldsAreRefusedNamingTheField) {
  struct Case { std::string field; json value; json base; };
  const json q = qwen25_config(), l = llama_config();
  json mistral = l;
  mistral["architectures"] = {"MistralForCausalLM"}, mistral["model_type"] = "mistral";
  json mistral_no_window = mistral;
  mistral["sliding_window"] = nullptr;
  EXPECT_NO_THROW(parse_hf_config(mistral.dump(), "m"));
  const std::vector<Case> cases = {
      {"use_sliding_window", true, q},
      {"sliding_window", 4096, mistral},
      {"num_experts", 8, q},
      {"num_local_experts", 8, mistral},
      {"num_experts_per_tok", 2, l},
      {"attention_bias", true, l},
      {"mlp_bias", true, l},
      {"hidden_act", "gelu", l},
      {"attention_dropout", 0.1, q},
      {"head_dim", 7, l},
      {"architectures", json::array({"GPT2LMHeadModel"}), l},
      {"model_type", "gemma", l},
      {"quantization_config", json::object({{"quant_method", "gptq"}}), l},
      {"layer_types", json::array({"full_attention", "sliding_attention"}), q},
      {"hidden_size", 0, l},
      {"num_key_value_heads", "2", l},
  };
  for (const auto& c : cases) {
    json j = c.base;
    j[c.field] = c.value;
    std::string e = error_of([&] { parse_hf_config(j.dump(), "x/config.json"); });
    EXPECT_NE(e.find("x/config.json: field '" + c.field + "'"), std::string::npos) << c.field << ": " << e;
    EXPECT_NE(e.find("nothing was written"), std::string::npos) << e;
  }
  // Mistral without the field at all: MistralConfig reads that as a 4096-token window.
  mistral_no_window.erase("sliding_window");
  std::string e = error_of([&] { parse_hf_config(mistral_no_window.dump(), "m"); });
  EXPECT_NE(e.find("field 'sliding_window' is absent"), std::string::npos) << e;
  json missing = l;
  missing.erase("num_hidden_layers");
  e = error_of([&] { parse_hf_config(missing.dump(), "m"); });
  EXPECT_NE(e.find("field 'num_hidden_layers' is missing"), std::string::npos) << e;
  e = error_of([&] { parse_hf_config("{\"a\": ", "m/config.json"); });
  EXPECT_NE(e.find("m/config.json: does not parse as JSON"), std::string::npos) << e;
  // Shapes the model cannot take: the error names the HF fields they came from.
  json odd = l;
  odd["num_key_value_heads"] = 3;
  e = error_of([&] { Config cfg; set_model_keys(parse_hf_config(odd.dump(), "o"), cfg, "o"); });
  EXPECT_NE(e.find("num_key_value_heads"), std::string::npos) << e;
}

// The config.json of Qwen/Qwen3-0.6B as published: head_dim 128 beside hidden_size 1024 / 16 heads.
static json qwen3_config() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(HfConfig, RealQwen3AndLlama32ConfigsParse) {
  HfModel q = parse_hf_config(qwen3_config().dump(), "qwen3/config.json");
  EXPECT_EQ(q.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(q.dims.qk_norm);
  EXPECT_FALSE(q.qkv_bias);
  EXPECT_EQ(q.dims.head_dim, 128);
  Config qc;
  set_model_keys(q, qc, "qwen3/config.json");
  const ModelDims qd = model_dims(qc, 0);
  EXPECT_EQ(qd.head_dim, 128);
  EXPECT_TRUE(qd.qk_norm);
  EXPECT_EQ(qd.num_params(), 596049920);  // Qwen3-0.6B's parameter count (tied head)
  const json out = json::parse(hf_config_json(qc, qd, "bfloat16"));
  EXPECT_EQ(out["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(out["model_type"], "qwen3");
  EXPECT_EQ(out["head_dim"], 128);
  EXPECT_EQ(out["attention_bias"], false);
  EXPECT_TRUE(out["rope_scaling"].is_null());
  HfModel back = parse_hf_config(out.dump(), "exported");
  EXPECT_TRUE(back.dims.qk_norm);
  EXPECT_EQ(back.dims.head_dim, 128);
  // Llama 3.2 1B's config: llama3 scaling under rope_scaling, exported back in that form.
  json l32 = llama_config();
  l32["rope_theta"] = 500000.0;
  l32["max_position_embeddings"] = 131072;
  l32["rope_scaling"] = json::parse(R"({"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                        "original_max_position_embeddings": 8192, "rope_type": "llama3"})");
  HfModel l = parse_hf_config(l32.dump(), "llama32/config.json");
  const RopeScaling& r = l.dims.rope_scaling;
  EXPECT_EQ(r.type, "llama3");
  EXPECT_EQ(r.factor, 32.0);
  EXPECT_EQ(r.original_max_positions, 8192);
  EXPECT_EQ(r.low_freq_factor, 1.0);
  EXPECT_EQ(r.high_freq_factor, 4.0);
  Config lc;
  set_model_keys(l, lc, "llama32/config.json");
  EXPECT_EQ(lc.s("model.rope_scaling.type"), "llama3");
  EXPECT_EQ(lc.s("model.rope_scaling.field"), "rope_scaling");
  const json lo = json::parse(hf_config_json(lc, model_dims(lc, 0), "bfloat16"));
  EXPECT_EQ(lo["rope_scaling"], l32["rope_scaling"]);
  // Qwen2.5's YaRN recipe ({"type": "yarn"}, transformers 4's older key) and transformers 5's
  // rope_parameters: read, and written back under the field they came in.
  json qy = qwen25_config();
  qy["rope_scaling"] = json::parse(R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})");
  HfModel y = parse_hf_config(qy.dump(), "qwen25/config.json");
  EXPECT_EQ(y.dims.rope_scaling.type, "yarn");
  EXPECT_EQ(y.dims.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(y.dims.rope_scaling.beta_slow, 1.0);
  EXPECT_NEAR(rope_table(64, 1e6, y.dims.rope_scaling).scale, 0.1 * std::log(4.0) + 1, 1e-15);
  json v5 = llama_config();
  v5.erase("rope_theta");
  v5["rope_parameters"] = json::parse(R"({"rope_type": "linear", "factor": 2.0, "rope_theta": 25000.0})");
  HfModel p = parse_hf_config(v5.dump(), "v5/config.json");
  EXPECT_EQ(p.dims.rope_theta, 25000.0);
  EXPECT_EQ(p.rope_field, "rope_parameters");
  Config pc;
  set_model_keys(p, pc, "v5/config.json");
  const json po = json::parse(hf_config_json(pc, model_dims(pc, 0), "float32"));
  EXPECT_EQ(po["rope_parameters"]["rope_type"], "linear");
  EXPECT_EQ(po["rope_parameters"]["factor"], 2.0);
  EXPECT_EQ(po["rope_parameters"]["rope_theta"], 25000.0);
  EXPECT_FALSE(po.contains("rope_scaling"));
}

TEST(HfConfig, RopeScalingAndQwen3RefusalsNameTheField) {
  struct Case { json rope; std::string field; std::string says; };
  const std::vector<Case> cases = {
      {json::parse(R"({"rope_type": "llama3", "factor": 8.0})"), "rope_scaling.low_freq_factor", "is missing"},
      {json::parse(R"({"rope_type": "linear"})"), "rope_scaling.factor", "is missing"},
      {json::parse(R"({"rope_type": "dynamic", "factor": 2.0})"), "rope_scaling.rope_type", "is not supported"},
      {json::parse(R"({"type": "longrope", "factor": 2.0})"), "rope_scaling.type", "is not supported"},
      {json::parse(R"({"rope_type": "yarn", "factor": 4.0, "mscale": 0.7})"), "rope_scaling.mscale", "is not supported"},
      {json::parse(R"({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0})"), "rope_scaling.low_freq_factor",
       "is not supported with rope_type \"linear\""},
      {json::parse(R"({"rope_type": "linear", "factor": 0.5})"), "rope_scaling", "factor must be a number >= 1"},
      {json::parse(R"({"rope_type": "yarn", "factor": "4"})"), "rope_scaling.factor", "must be a number"},
      {json::parse(R"({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5})"),
       "rope_scaling.partial_rotary_factor", "whole head"},
      {json::parse(R"({"rope_type": "yarn", "type": "linear", "factor": 2.0})"), "rope_scaling.type", "contradicts"},
      {json::parse(R"({"factor": 2.0})"), "rope_scaling.rope_type", "is missing"},
      {json::parse(R"("yarn")"), "rope_scaling", "must be an object"},
  };
  for (const auto& c : cases) {
    json j = llama_config();
    j["rope_scaling"] = c.rope;
    const std::string e = error_of([&] { parse_hf_config(j.dump(), "x/config.json"); });
    EXPECT_NE(e.find("x/config.json: field '" + c.field + "'"), std::string::npos) << c.rope.dump() << ": " << e;
    EXPECT_NE(e.find(c.says), std::string::npos) << c.rope.dump() << ": " << e;
  }
  json both = llama_config();
  both["rope_scaling"] = json::parse(R"({"rope_type": "linear", "factor": 2.0})");
  both["rope_parameters"] = json::parse(R"({"rope_type": "linear", "factor": 2.0})");
  std::string e = error_of([&] { parse_hf_config(both.dump(), "b"); });
  EXPECT_NE(e.find("field 'rope_parameters' and rope_scaling both give a scaling"), std::string::npos) << e;
  // Qwen3 with biases (attention_bias = true puts them on q, k, v and o_proj) is refused.
  json qb = qwen3_config();
  qb["attention_bias"] = true;
  e = error_of([&] { parse_hf_config(qb.dump(), "q3/config.json"); });
  EXPECT_NE(e.find("q3/config.json: field 'attention_bias' = true: Qwen3 with biases"), std::string::npos) << e;
  // Without head_dim, hidden_size must divide by the heads.
  json odd = llama_config();
  odd["num_attention_heads"] = 5, odd["num_key_value_heads"] = 5;
  e = error_of([&] { parse_hf_config(odd.dump(), "o/config.json"); });
  EXPECT_NE(e.find("field 'hidden_size' = 896 is not divisible by num_attention_heads = 5"), std::string::npos) << e;
  // For a run: an unknown type, a factor below 1 and llama3 / yarn without the original context.
  const std::vector<std::pair<std::vector<std::string>, std::string>> runs = {
      {{"model.rope_scaling.type=ntk"}, "model.rope_scaling.type"},
      {{"model.rope_scaling.factor=0.5"}, "model.rope_scaling.factor"},
      {{"model.rope_scaling.type=yarn", "model.rope_scaling.factor=4"},
       "model.rope_scaling.original_max_position_embeddings must be set (> 0) for rope_scaling.type = yarn"},
      {{"model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
        "model.rope_scaling.original_max_position_embeddings=8192", "model.rope_scaling.high_freq_factor=1"},
       "model.rope_scaling.high_freq_factor must be > low_freq_factor"}};
  for (const auto& [sets, says] : runs) {
    e = error_of([&] { (void)model_dims(Config::load("", sets), 100); });
    EXPECT_NE(e.find(says), std::string::npos) << sets[0] << ": " << e;
  }
  e = error_of([&] { (void)model_dims(Config::load("", std::vector<std::string>{"model.qk_norm=true", "model.qkv_bias=true"}), 100); });
  EXPECT_NE(e.find("model.qk_norm = true with model.qkv_bias = true is not supported"), std::string::npos) << e;
}

TEST(HfConfig, ShippedConfigsHaveTheRealShapes) {
  // configs/qwen2.5-*.toml: the published parameter counts (0.49B, 3.09B), which --init-from then
  // checks against the real config.json.
  for (auto [file, params, head_dim] : {std::tuple{"qwen2.5-0.5b.toml", int64_t(494032768), 64},
                                        std::tuple{"qwen2.5-3b.toml", int64_t(3085938688), 128}}) {
    Config cfg = Config::load(std::string(SB_SOURCE_DIR) + "/configs/" + file, {});
    const ModelDims d = model_dims(cfg, 0);
    EXPECT_EQ(d.num_params(), params) << file;
    EXPECT_EQ(d.head_dim, head_dim) << file;
    EXPECT_EQ(cfg.i("attention.block_size"), head_dim) << file;
    EXPECT_TRUE(d.qkv_bias && d.tied) << file;
    EXPECT_EQ(d.rope_theta, 1e6) << file;
    EXPECT_EQ(d.norm_eps, 1e-6) << file;
  }
  // configs/qwen3-0.6b.toml and llama3.2-1b.toml (bench/torch/hf_finetune.sh): the published counts,
  // Qwen3's head_dim and q/k norms, Llama 3.2's llama3 scaling; block 128 (the wgmma kernels).
  const Config q3 = Config::load(std::string(SB_SOURCE_DIR) + "/configs/qwen3-0.6b.toml", {});
  const ModelDims dq = model_dims(q3, 0);
  EXPECT_EQ(dq.num_params(), 596049920);
  EXPECT_TRUE(dq.head_dim == 128 && dq.qk_norm && !dq.qkv_bias && dq.tied);
  EXPECT_EQ(dq.rope_scaling.type, "none");
  const Config l32 = Config::load(std::string(SB_SOURCE_DIR) + "/configs/llama3.2-1b.toml", {});
  const ModelDims dl = model_dims(l32, 0);
  EXPECT_EQ(dl.num_params(), 1235814400);
  EXPECT_TRUE(dl.head_dim == 64 && !dl.qk_norm && !dl.qkv_bias && dl.tied);
  EXPECT_EQ(dl.rope_theta, 500000.0);
  EXPECT_EQ(dl.norm_eps, 1e-5);
  const RopeScaling& r = dl.rope_scaling;
  EXPECT_TRUE(r.type == "llama3" && r.factor == 32 && r.low_freq_factor == 1 && r.high_freq_factor == 4 &&
              r.original_max_positions == 8192);
  EXPECT_EQ(q3.i("attention.block_size"), 128);
  EXPECT_EQ(l32.i("attention.block_size"), 128);
}
