#include "src/hf/hf_config.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/input_file.hpp"
#include "src/train/settings.hpp"

namespace sb {

using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHfJsonBytes = 64ull << 20;  // a config.json is a few KB

struct Arch {
  const char* name;
  const char* model_type;
  int64_t max_pos;  // the config class's default max_position_embeddings
  bool qkv_bias;
};
constexpr Arch kArchs[] = {
    {"LlamaForCausalLM", "llama", 2048, false},
    {"MistralForCausalLM", "mistral", 131072, false},
    {"Qwen2ForCausalLM", "qwen2", 32768, true},
};

// Reads config.json fields with errors that name the file and the field.
struct Fields {
  const json& j;
  const std::string& origin;

  [[noreturn]] void refuse(const std::string& field, const std::string& why) const {
    throw Error(origin + ": field '" + field + "' " + why + "; nothing was written");
  }
  bool set(const char* f) const { return j.contains(f) && !j[f].is_null(); }
  int64_t integer(const char* f, int64_t def, bool required = false) const {
    if (!set(f)) {
      if (required) refuse(f, "is missing (a positive integer is required)");
      return def;
    }
    if (!j[f].is_number_integer()) refuse(f, "must be an integer, got " + j[f].dump());
    if (j[f].is_number_unsigned() && j[f].get<uint64_t>() > uint64_t(INT64_MAX))
      refuse(f, "= " + j[f].dump() + " is out of range (above 2^63-1)");
    return j[f].get<int64_t>();
  }
  double number(const char* f, double def) const {
    if (!set(f)) return def;
    if (!j[f].is_number()) refuse(f, "must be a number, got " + j[f].dump());
    return j[f].get<double>();
  }
  bool boolean(const char* f, bool def) const {
    if (!set(f)) return def;
    if (!j[f].is_boolean()) refuse(f, "must be true or false, got " + j[f].dump());
    return j[f].get<bool>();
  }
  // A field whose only honourable value is "absent, null, false or 0".
  void must_be_off(const char* f, const std::string& why) const {
    if (!set(f)) return;
    const json& v = j[f];
    if ((v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0)) return;
    refuse(f, "= " + v.dump() + ": " + why);
  }
};

std::string num(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

}  // namespace

HfModel parse_hf_config(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(origin + ": does not parse as JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(origin + ": expected a JSON object (an HF config.json)");
  Fields F{j, origin};

  // Architecture: "architectures": ["X"], checked against model_type when both are there.
  const Arch* arch = nullptr;
  std::string known;
  for (const auto& a : kArchs) known += std::string(known.empty() ? "" : ", ") + a.name;
  if (F.set("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || !a[0].is_string())
      F.refuse("architectures", "must list exactly one architecture, got " + a.dump());
    for (const auto& k : kArchs)
      if (a[0].get<std::string>() == k.name) arch = &k;
    if (!arch) F.refuse("architectures", "= " + a.dump() + " is not supported (supported: " + known + ")");
  }
  if (F.set("model_type")) {
    if (!j["model_type"].is_string()) F.refuse("model_type", "must be a string");
    const std::string mt = j["model_type"].get<std::string>();
    const Arch* by_type = nullptr;
    for (const auto& k : kArchs)
      if (mt == k.model_type) by_type = &k;
    if (!by_type) F.refuse("model_type", "= \"" + mt + "\" is not supported (llama, mistral, qwen2)");
    if (arch && arch != by_type)
      F.refuse("model_type", "= \"" + mt + "\" contradicts architectures [\"" + arch->name + "\"]");
    arch = by_type;
  }
  if (!arch) F.refuse("architectures", "is missing (and so is model_type): cannot tell the model (" + known + ")");

  HfModel hf;
  hf.architecture = arch->name;
  hf.qkv_bias = arch->qkv_bias;
  ModelDims& d = hf.dims;
  // Each checked against its [model] key's range before it is narrowed to int: 4294967297 must not
  // wrap to 1, and the message says the range that holds (1..max: 0, "from the data", is no size here).
  const auto dim = [&](const char* f, const char* key, int64_t def, bool required) {
    const int64_t x = F.integer(f, def, required);
    const int64_t lo = std::max<int64_t>(1, int64_t(find_key(key)->min)), hi = int64_t(find_key(key)->max);
    if (x < lo || x > hi)
      F.refuse(f, "= " + std::to_string(x) + " is out of range: expected " + std::to_string(lo) + " <= value <= " +
                      std::to_string(hi) + " (the range of " + key + ")");
    return int(x);
  };
  d.d_model = dim("hidden_size", "model.d_model", 0, true);
  d.ffn_dim = dim("intermediate_size", "model.ffn_dim", 0, true);
  d.n_layers = dim("num_hidden_layers", "model.n_layers", 0, true);
  d.n_heads = dim("num_attention_heads", "model.n_heads", 0, true);
  d.vocab = dim("vocab_size", "model.vocab_size", 0, true);
  d.n_kv_heads = dim("num_key_value_heads", "model.n_kv_heads", d.n_heads, false);
  d.tied = F.boolean("tie_word_embeddings", false);  // the three config classes default to untied
  d.norm_eps = F.number("rms_norm_eps", 1e-6);
  d.rope_theta = F.number("rope_theta", 10000.0);
  d.init_std = F.number("initializer_range", 0.02);
  hf.max_position_embeddings = F.integer("max_position_embeddings", arch->max_pos);
  if (d.n_heads > 0 && d.d_model % d.n_heads == 0) d.head_dim = d.d_model / d.n_heads;
  if (F.set("head_dim") && F.integer("head_dim", 0) != int64_t(d.d_model) / std::max(d.n_heads, 1))
    F.refuse("head_dim", "= " + j["head_dim"].dump() + " differs from hidden_size / num_attention_heads = " +
                             std::to_string(d.d_model / std::max(d.n_heads, 1)) +
                             ": the model derives head_dim from them");

  // RoPE: plain rotate-half only. transformers 4.x writes rope_scaling (null when plain);
  // newer versions write rope_parameters {"rope_type": "default", "rope_theta": ...}.
  auto plain_rope = [&](const char* f) {
    if (!F.set(f)) return;
    const json& r = j[f];
    const char* tk = r.is_object() && r.contains("rope_type") ? "rope_type" : "type";
    if (!r.is_object() || !r.contains(tk) || r[tk] != "default")
      F.refuse(f, "= " + r.dump() + ": only plain RoPE (null or rope_type \"default\") is supported, no scaling");
    for (auto& [k, v] : r.items())
      if (k != "rope_type" && k != "type" && k != "rope_theta")
        F.refuse(std::string(f) + "." + k, "is not supported (plain RoPE takes only rope_theta)");
    if (r.contains("rope_theta")) {
      if (!r["rope_theta"].is_number()) F.refuse(std::string(f) + ".rope_theta", "must be a number");
      d.rope_theta = r["rope_theta"].get<double>();
    }
  };
  plain_rope("rope_scaling");
  plain_rope("rope_parameters");

  // Attention everywhere full and causal.
  if (F.boolean("use_sliding_window", false))
    F.refuse("use_sliding_window", "= true: the model has no sliding-window attention");
  if (F.boolean("use_mrope", false)) F.refuse("use_mrope", "= true: only plain 1-D RoPE is supported");
  if (hf.architecture != std::string("Qwen2ForCausalLM")) {
    // Mistral applies sliding_window whenever it is set, and MistralConfig defaults it to 4096.
    if (F.set("sliding_window"))
      F.refuse("sliding_window", "= " + j["sliding_window"].dump() + ": the model has no sliding-window attention (null is supported)");
    if (hf.architecture == std::string("MistralForCausalLM") && !j.contains("sliding_window"))
      F.refuse("sliding_window", "is absent, which MistralConfig reads as 4096: the model has no sliding window; set it to null");
  }
  if (F.set("layer_types")) {
    if (!j["layer_types"].is_array()) F.refuse("layer_types", "must be a list");
    for (const auto& t : j["layer_types"])
      if (t != "full_attention") F.refuse("layer_types", "holds " + t.dump() + ": only \"full_attention\" layers are supported");
  }

  // Biases: q/k/v (Qwen2, always there) are the one kind the model has; o_proj and MLP biases are refused.
  if (F.boolean("attention_bias", false))
    F.refuse("attention_bias", "= true (biases on q/k/v and o_proj): the model has q/k/v biases only (as Qwen2), "
                               "none on o_proj");
  if (F.boolean("mlp_bias", false)) F.refuse("mlp_bias", "= true: the model has no MLP biases");

  for (const char* f : {"hidden_act", "hidden_activation"})
    if (F.set(f) && j[f] != "silu") F.refuse(f, "= " + j[f].dump() + ": only \"silu\" (SwiGLU) is supported");
  for (const char* f : {"num_experts", "num_local_experts", "num_experts_per_tok", "n_routed_experts", "n_shared_experts",
                        "moe_intermediate_size", "shared_expert_intermediate_size", "moe_layer_freq", "decoder_sparse_step"})
    F.must_be_off(f, "mixture-of-experts models are not supported");
  for (const char* f : {"attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop"})
    F.must_be_off(f, "the model has no dropout");
  if (F.set("quantization_config")) F.refuse("quantization_config", "is set: quantized weights are not supported");
  if (F.boolean("is_encoder_decoder", false)) F.refuse("is_encoder_decoder", "= true: only decoder-only models are supported");
  return hf;
}

HfModel read_hf_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  // The input-file rule: a FIFO would block, /dev/zero would read until memory runs out.
  return parse_hf_config(read_input_file(path, "an HF config.json (an HF model directory holds one)", kMaxHfJsonBytes),
                         path);
}

void set_model_keys(const HfModel& hf, Config& cfg, const std::string& origin) {
  const ModelDims& d = hf.dims;
  auto set = [&](const char* key, const std::string& v, const char* field) {
    cfg.set(key, v, origin + " (field '" + field + "')");
  };
  set("model.n_layers", std::to_string(d.n_layers), "num_hidden_layers");
  set("model.d_model", std::to_string(d.d_model), "hidden_size");
  set("model.n_heads", std::to_string(d.n_heads), "num_attention_heads");
  set("model.n_kv_heads", std::to_string(d.n_kv_heads), "num_key_value_heads");
  set("model.ffn_dim", std::to_string(d.ffn_dim), "intermediate_size");
  set("model.vocab_size", std::to_string(d.vocab), "vocab_size");
  set("model.rope_theta", num(d.rope_theta), "rope_theta");
  set("model.norm_eps", num(d.norm_eps), "rms_norm_eps");
  set("model.tie_embeddings", d.tied ? "true" : "false", "tie_word_embeddings");
  set("model.qkv_bias", hf.qkv_bias ? "true" : "false", "architectures");
  set("model.init_std", num(d.init_std), "initializer_range");
  set("model.max_position_embeddings", std::to_string(hf.max_position_embeddings), "max_position_embeddings");
  try {
    (void)model_dims(cfg, 0);  // divisibility, even head_dim
  } catch (const Error& e) {
    throw Error(origin + ": " + e.what() + " (from num_attention_heads / num_key_value_heads / hidden_size)");
  }
}

const char* hf_architecture(const ModelDims& d) { return d.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"; }

std::string hf_config_json(const Config& cfg, const ModelDims& d, const std::string& torch_dtype) {
  json j = {
      {"architectures", {hf_architecture(d)}},
      {"model_type", d.qkv_bias ? "qwen2" : "llama"},
      {"hidden_size", d.d_model},
      {"intermediate_size", d.ffn_dim},
      {"num_hidden_layers", d.n_layers},
      {"num_attention_heads", d.n_heads},
      {"num_key_value_heads", d.n_kv_heads},
      {"head_dim", d.head_dim},
      {"vocab_size", d.vocab},
      {"hidden_act", "silu"},
      {"rms_norm_eps", d.norm_eps},
      {"rope_theta", d.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", d.tied},
      {"max_position_embeddings", cfg.i("model.max_position_embeddings")},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"initializer_range", d.init_std},
      {"use_cache", true},
      {"torch_dtype", torch_dtype},
  };
  if (d.qkv_bias) {  // Qwen2Config: biases implied; full attention in every layer
    j.erase("attention_bias"), j.erase("mlp_bias");
    j["use_sliding_window"] = false, j["sliding_window"] = nullptr, j["max_window_layers"] = d.n_layers;
  }
  return j.dump(2) + "\n";
}

}  // namespace sb
