#include "src/hf/hf_config.hpp"

#include <algorithm>
#include <cmath>
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
  bool qkv_bias;     // Qwen2: q/k/v biases
  bool qk_norm;      // Qwen3: q_norm / k_norm
};
constexpr Arch kArchs[] = {
    {"LlamaForCausalLM", "llama", 2048, false, false},
    {"MistralForCausalLM", "mistral", 131072, false, false},
    {"Qwen2ForCausalLM", "qwen2", 32768, true, false},
    {"Qwen3ForCausalLM", "qwen3", 40960, false, true},
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
    if (!by_type) F.refuse("model_type", "= \"" + mt + "\" is not supported (llama, mistral, qwen2, qwen3)");
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
  d.qk_norm = arch->qk_norm;
  // head_dim: hidden_size / num_attention_heads unless the config gives it (Qwen3 decouples them).
  if (d.n_heads > 0 && d.d_model % d.n_heads == 0) d.head_dim = d.d_model / d.n_heads;
  if (F.set("head_dim")) {
    const int64_t hd = F.integer("head_dim", 0);
    if (hd <= 0 || hd % 2 || hd > 65536) F.refuse("head_dim", "= " + j["head_dim"].dump() + ": must be a positive even integer");
    d.head_dim = int(hd);
  } else if (d.n_heads > 0 && d.d_model % d.n_heads) {
    F.refuse("hidden_size", "= " + std::to_string(d.d_model) + " is not divisible by num_attention_heads = " +
                                std::to_string(d.n_heads) + " and there is no head_dim");
  }

  // RoPE: plain, linear, llama3 or yarn. transformers 4.x writes rope_scaling (null when plain;
  // {"rope_type": ...} or the older {"type": ...}); transformers 5 writes rope_parameters
  // {"rope_type", "rope_theta", ...}.
  bool scaled = false;
  auto rope = [&](const char* f) {
    if (!F.set(f)) return;
    const json& r = j[f];
    const std::string fs(f);
    if (!r.is_object()) F.refuse(f, "= " + r.dump() + ": must be an object with rope_type (or null)");
    if (!r.contains("rope_type") && !r.contains("type")) F.refuse(fs + ".rope_type", "is missing");
    const char* tk = r.contains("rope_type") ? "rope_type" : "type";
    if (!r[tk].is_string()) F.refuse(fs + "." + tk, "must be a string, got " + r[tk].dump());
    const std::string type = r[tk].get<std::string>();
    if (r.contains("rope_type") && r.contains("type") && r["type"] != r["rope_type"])
      F.refuse(fs + ".type", "= " + r["type"].dump() + " contradicts rope_type " + r["rope_type"].dump());
    // The fields each type takes (transformers' names); anything else is refused by name.
    std::vector<std::string> takes = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
    if (type == "linear") takes.insert(takes.end(), {"factor"});
    else if (type == "llama3")
      takes.insert(takes.end(), {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    else if (type == "yarn")
      takes.insert(takes.end(), {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                                 "beta_slow", "truncate"});
    else if (type != "default")
      F.refuse(fs + "." + tk, "= \"" + type + "\" is not supported (default, linear, llama3, yarn)");
    for (auto& [k, v] : r.items())
      if (std::find(takes.begin(), takes.end(), k) == takes.end())
        F.refuse(fs + "." + k, "is not supported with rope_type \"" + type + "\" (it takes: " + [&] {
          std::string o;
          for (size_t i = 2; i < takes.size(); ++i) o += (i > 2 ? ", " : "") + takes[i];
          return o;
        }() + ")");
    auto number = [&](const char* k, bool required, double def) {
      if (!r.contains(k) || r[k].is_null()) {
        if (required) F.refuse(fs + "." + k, "is missing (rope_type \"" + type + "\" requires it)");
        return def;
      }
      if (!r[k].is_number()) F.refuse(fs + "." + k, "must be a number, got " + r[k].dump());
      return r[k].get<double>();
    };
    if (r.contains("rope_theta")) d.rope_theta = number("rope_theta", true, 0);
    if (r.contains("partial_rotary_factor") && number("partial_rotary_factor", true, 1) != 1.0)
      F.refuse(fs + ".partial_rotary_factor", "= " + r["partial_rotary_factor"].dump() + ": RoPE over the whole head only (1.0)");
    if (type == "default") return;
    if (scaled) F.refuse(fs, "and rope_scaling both give a scaling; keep one");
    scaled = true;
    hf.rope_field = fs;
    RopeScaling& s = d.rope_scaling;
    s.type = type;
    s.factor = number("factor", true, 1);
    if (type == "llama3") {
      s.low_freq_factor = number("low_freq_factor", true, 1);
      s.high_freq_factor = number("high_freq_factor", true, 4);
    }
    if (type != "linear") {
      const double o = number("original_max_position_embeddings", type == "llama3", 0);
      if (o != 0 && (o != std::floor(o) || o < 1 || o > (1 << 30)))
        F.refuse(fs + ".original_max_position_embeddings", "must be a positive integer, got " + r["original_max_position_embeddings"].dump());
      // yarn without it: transformers takes max_position_embeddings
      s.original_max_positions = o != 0 ? int(o) : int(hf.max_position_embeddings);
    }
    if (type == "yarn") {
      s.attention_factor = number("attention_factor", false, 0);
      s.beta_fast = number("beta_fast", false, 32);
      s.beta_slow = number("beta_slow", false, 1);
      if (r.contains("truncate") && !r["truncate"].is_boolean()) F.refuse(fs + ".truncate", "must be true or false");
      s.truncate = r.value("truncate", true);
    }
    try {
      check_rope_scaling(s);
    } catch (const Error& e) {
      F.refuse(fs, std::string("does not describe a usable scaling: ") + e.what());
    }
  };
  rope("rope_scaling");
  rope("rope_parameters");

  // Attention everywhere full and causal.
  if (F.boolean("use_sliding_window", false))
    F.refuse("use_sliding_window", "= true: the model has no sliding-window attention");
  if (F.boolean("use_mrope", false)) F.refuse("use_mrope", "= true: only plain 1-D RoPE is supported");
  if (!arch->qkv_bias && !arch->qk_norm) {  // Qwen2 and Qwen3 read sliding_window only with use_sliding_window
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
  if (d.qk_norm && F.boolean("attention_bias", false))
    F.refuse("attention_bias", "= true: Qwen3 with biases on q/k/v and o_proj is not supported (the model's Qwen3 has none)");
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
  set("model.head_dim", std::to_string(d.head_dim), "head_dim");
  set("model.qk_norm", d.qk_norm ? "true" : "false", "architectures");
  const RopeScaling& r = d.rope_scaling;
  const char* rf = hf.rope_field.c_str();
  set("model.rope_scaling.type", r.type, rf);
  set("model.rope_scaling.factor", num(r.factor), rf);
  set("model.rope_scaling.original_max_position_embeddings", std::to_string(r.original_max_positions), rf);
  set("model.rope_scaling.low_freq_factor", num(r.low_freq_factor), rf);
  set("model.rope_scaling.high_freq_factor", num(r.high_freq_factor), rf);
  set("model.rope_scaling.beta_fast", num(r.beta_fast), rf);
  set("model.rope_scaling.beta_slow", num(r.beta_slow), rf);
  set("model.rope_scaling.attention_factor", num(r.attention_factor), rf);
  set("model.rope_scaling.truncate", r.truncate ? "true" : "false", rf);
  set("model.rope_scaling.field", hf.rope_field, rf);
  try {
    (void)model_dims(cfg, 0);  // divisibility, even head_dim
  } catch (const Error& e) {
    throw Error(origin + ": " + e.what() + " (from num_attention_heads / num_key_value_heads / hidden_size)");
  }
}

const char* hf_architecture(const ModelDims& d) {
  if (d.qk_norm && d.qkv_bias)
    throw Error("model.qk_norm and model.qkv_bias together have no Hugging Face architecture (Qwen3 has no q/k/v biases)");
  return d.qk_norm ? "Qwen3ForCausalLM" : d.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
}

// The scaling as transformers writes it (the fields its rope_type reads); under rope_parameters
// (transformers 5) with rope_theta beside them.
static json rope_json(const Config& cfg, const ModelDims& d) {
  const RopeScaling& r = d.rope_scaling;
  const bool v5 = cfg.s("model.rope_scaling.field") == "rope_parameters";
  if (r.type == "none") return v5 ? json{{"rope_type", "default"}, {"rope_theta", d.rope_theta}} : json(nullptr);
  json o = {{"rope_type", r.type}, {"factor", r.factor}};
  if (v5) o["rope_theta"] = d.rope_theta;
  if (r.type == "llama3")
    o["low_freq_factor"] = r.low_freq_factor, o["high_freq_factor"] = r.high_freq_factor;
  if (r.type == "llama3" || r.type == "yarn") o["original_max_position_embeddings"] = r.original_max_positions;
  if (r.type == "yarn") {
    o["beta_fast"] = r.beta_fast, o["beta_slow"] = r.beta_slow;
    if (r.attention_factor > 0) o["attention_factor"] = r.attention_factor;
    if (!r.truncate) o["truncate"] = false;
  }
  return o;
}

std::string hf_config_json(const Config& cfg, const ModelDims& d, const std::string& torch_dtype) {
  const std::string arch = hf_architecture(d);
  json j = {
      {"architectures", {arch}},
      {"model_type", d.qk_norm ? "qwen3" : d.qkv_bias ? "qwen2" : "llama"},
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
      {"tie_word_embeddings", d.tied},
      {"max_position_embeddings", cfg.i("model.max_position_embeddings")},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"initializer_range", d.init_std},
      {"use_cache", true},
      {"torch_dtype", torch_dtype},
  };
  j[cfg.s("model.rope_scaling.field")] = rope_json(cfg, d);
  if (d.qkv_bias || d.qk_norm) {  // Qwen2Config / Qwen3Config: full attention in every layer
    if (d.qkv_bias) j.erase("attention_bias");  // Qwen2: biases implied
    j.erase("mlp_bias");
    j["use_sliding_window"] = false, j["sliding_window"] = nullptr, j["max_window_layers"] = d.n_layers;
  }
  return j.dump(2) + "\n";
}

}  // namespace sb
