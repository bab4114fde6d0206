// LoRA checkpoints out: the base by reference, the merged weights, the PEFT adapter directory
// (hf_lora.hpp; io/SAFETENSORS.md "LoRA exports").
#include "src/hf/hf_lora.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "io/file_checksum.hpp"
#include "io/h5.hpp"
#include "src/hf/hf_convert.hpp"
#include "src/train/settings.hpp"

namespace sb {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

static const std::string kRandomBase = "random, train.seed = ";

LoraBaseRef read_lora_base_ref(const std::string& ckpt) {
  LoraBaseRef r;
  h5::Id f = h5::open_read(ckpt, "a checkpoint");
  if (!h5::exists(f, "lora")) return r;
  h5::Id g = h5::group(f, "lora", false);
  r.base = h5::read_attr_string(g, "base", ckpt);
  r.xxh64 = h5::read_attr_string(g, "base_xxh64", ckpt);
  r.vocab = h5::read_attr_int(g, "vocab", ckpt);
  return r;
}

std::string weights_xxh64(const std::vector<float>& w) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(xxh64(w.data(), w.size() * sizeof(float))));
  return hex;
}

// The stored config's shape and [lora]; the checkpoint's tensors must be that trainable layout.
static Model<float> lora_model(const std::string& ckpt, const Checkpoint& ck, const Config& cfg, const LoraBaseRef& ref) {
  const LoraSpec spec = lora_spec(cfg);
  if (!spec.on() || ref.xxh64.empty())
    throw Error(ckpt + ": not a LoRA checkpoint (lora.rank = 0 or no /lora group); a full checkpoint exports with "
                "`convert SRC DST` (without --merge)");
  Model<float> m(model_dims(cfg, ref.vocab), spec);
  const auto& ps = m.params();
  bool same = ps.size() == ck.tensors.size();
  for (size_t i = 0; same && i < ps.size(); ++i) same = ps[i].name == ck.tensors[i].name && ps[i].shape == ck.tensors[i].shape;
  if (!same)
    throw Error(ckpt + ": its tensors are not the trainable layout of its stored [model] and [lora] keys (" +
                std::to_string(ck.tensors.size()) + " tensors, expected " + std::to_string(ps.size()) + ")");
  return m;
}

std::vector<float> lora_base_weights(const std::string& ckpt, const Config& cfg, const std::string& override_path) {
  const LoraBaseRef ref = read_lora_base_ref(ckpt);
  if (ref.xxh64.empty()) throw Error(ckpt + ": not a LoRA checkpoint (no /lora group)");
  const ModelDims dims = model_dims(cfg, ref.vocab);
  const std::string path = override_path.empty() ? ref.base : override_path;
  std::vector<float> w;
  if (override_path.empty() && ref.base.starts_with(kRandomBase)) {  // a random base: rebuilt from its seed
    Model<float> m(dims, lora_spec(cfg));
    m.init(std::stoull(ref.base.substr(kRandomBase.size())));
    w = m.base();
  } else {
    if (!fs::exists(path))
      throw Error(ckpt + ": its base " + path + " does not exist" +
                  (override_path.empty() ? "; pass the base (an HF directory or a checkpoint) with --base PATH" : ""));
    Config c = cfg;
    w = init_weights_from(path, c, {});
    if (w.size() != ParamLayout(dims).size)
      throw Error("base " + path + ": " + std::to_string(w.size()) + " parameters, the LoRA checkpoint " + ckpt +
                  "'s model has " + std::to_string(ParamLayout(dims).size));
  }
  if (const std::string h = weights_xxh64(w); h != ref.xxh64)
    throw Error("base mismatch: " + ckpt + " trained its adapters on the base " + ref.base + " (XXH64 " + ref.xxh64 +
                "), but " + path + " has XXH64 " + h + "; pass that base with --base PATH");
  return w;
}

std::vector<float> lora_merged_weights(const std::string& ckpt, const Checkpoint& ck, const Config& cfg,
                                       const std::string& override_path) {
  Model<float> m = lora_model(ckpt, ck, cfg, read_lora_base_ref(ckpt));
  m.set_base(lora_base_weights(ckpt, cfg, override_path), false);
  m.weights() = ck.params;
  return m.merged();
}

std::string lora_to_peft(const std::string& src, const std::string& dst, StDtype dtype, bool overwrite) {
  std::error_code ec;
  const fs::path d = fs::weakly_canonical(fs::absolute(dst), ec);
  if (fs::exists(d, ec) && !fs::is_directory(d, ec))
    throw Error(dst + ": is a file; for a LoRA checkpoint SRC, DST is the PEFT adapter directory to write");
  const bool existed = fs::exists(d, ec);
  if (existed && !overwrite && !fs::is_empty(d, ec))
    throw Error(dst + ": already exists; choose another DST or pass --overwrite (which replaces adapter_config.json, "
                "adapter_model.safetensors and sparsebalance_lora.json, and keeps everything else)");
  const Checkpoint ck = read_checkpoint(src);
  const Config cfg = Config::from_text(ck.config_toml, src + " (stored config)");
  const LoraBaseRef ref = read_lora_base_ref(src);
  const Model<float> m = lora_model(src, ck, cfg, ref);
  const LoraSpec& s = m.lora();
  const ModelDims& dims = m.shape();

  // PEFT's saved names: "base_model.model." + the module path; a modules_to_save tensor under its
  // plain name (PEFT adds ".modules_to_save.default" when it loads it).
  std::vector<StOut> out;
  for (const auto& t : ck.tensors) {
    std::span<const float> data(ck.params.data() + t.offset, t.size);
    for (float x : data)
      if (!std::isfinite(x) || (dtype == StDtype::F16 && std::fabs(x) > 65504.0f))
        throw Error(src + ": tensor '" + t.name + "' holds " + std::to_string(x) + "; nothing was written");
    out.push_back({"base_model.model." + t.name, t.shape, data});
    // tied embeddings trained: PEFT replaces embed_tokens and lm_head separately, so both get the tensor
    if (dims.tied && t.name == "model.embed_tokens.weight") out.push_back({"base_model.model.lm_head.weight", t.shape, data});
  }
  ojson targets = ojson::array(), save = ojson::array();
  for (int t = 0; t < kLoraTargets; ++t)
    if (s.targets[size_t(t)]) targets.push_back(kLoraModuleNames[size_t(t)]);
  if (s.embed || (dims.tied && s.head)) save.push_back("embed_tokens");
  if (s.head || (dims.tied && s.embed)) save.push_back("lm_head");
  if (s.norm) {
    for (const char* n : {"input_layernorm", "post_attention_layernorm", "norm"}) save.push_back(n);
    if (dims.qk_norm) save.push_back("q_norm"), save.push_back("k_norm");
  }
  const bool random = ref.base.starts_with(kRandomBase);
  ojson cfgj = {{"peft_type", "LORA"},
                {"task_type", "CAUSAL_LM"},
                {"base_model_name_or_path", random ? ojson(nullptr) : ojson(ref.base)},
                {"r", s.rank},
                {"lora_alpha", s.alpha},
                {"lora_dropout", s.dropout},
                {"target_modules", targets},
                {"modules_to_save", save.empty() ? ojson(nullptr) : save},
                {"bias", "none"},
                {"fan_in_fan_out", false},
                {"init_lora_weights", true},
                {"use_rslora", false},
                {"use_dora", false},
                {"inference_mode", true},
                {"layers_to_transform", nullptr},
                {"layers_pattern", nullptr},
                {"rank_pattern", ojson::object()},
                {"alpha_pattern", ojson::object()}};
  ojson ours = {{"checkpoint", fs::absolute(src).lexically_normal().string()},
                {"step", ck.step},
                {"base", ref.base},
                {"base_xxh64", ref.xxh64}};
  fs::create_directories(d, ec);
  if (ec) throw Error(dst + ": cannot create: " + ec.message());
  try {
    Staged stage;
    write_safetensors((d / "adapter_model.safetensors").string(), out, dtype, &stage);
    write_text_file((d / "adapter_config.json").string(), cfgj.dump(2) + "\n", &stage);
    write_text_file((d / "sparsebalance_lora.json").string(), ours.dump(2) + "\n", &stage);
    stage.commit();
  } catch (const std::exception& e) {
    if (!existed) fs::remove(d, ec);
    throw Error(dst + ": export failed, nothing in it changed: " + e.what());
  }
  return src + " (step " + std::to_string(ck.step) + ", LoRA rank " + std::to_string(s.rank) + ", " +
         std::to_string(ck.params.size()) + " trainable parameters) -> " + dst +
         " (PEFT adapter: adapter_config.json, adapter_model.safetensors " + st_dtype_name(dtype) +
         ", sparsebalance_lora.json; base " + ref.base + ")";
}

std::string peft_adapter_base(const std::string& dir, const Config& cfg) {
  const fs::path cj = fs::path(dir) / "adapter_config.json";
  if (!fs::is_directory(dir) || !fs::exists(cj)) return "";
  nlohmann::json j;
  try {
    std::ifstream in(cj);
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(cj.string() + ": not valid JSON: " + e.what());
  }
  auto num = [&](const char* k) {
    if (!j.contains(k) || !j[k].is_number()) throw Error(cj.string() + ": field '" + k + "' is missing or not a number");
    return j[k].get<double>();
  };
  if (j.value("peft_type", "") != "LORA") throw Error(cj.string() + ": peft_type is not \"LORA\"");
  for (const char* k : {"use_rslora", "use_dora"})
    if (j.value(k, false)) throw Error(cj.string() + ": " + k + " = true is not supported (plain LoRA only)");
  if (const double r = num("r"); r != double(cfg.i("lora.rank")))
    throw Error(cj.string() + ": r = " + std::to_string(int64_t(r)) + ", but lora.rank = " + std::to_string(cfg.i("lora.rank")) +
                " (set lora.rank to the adapter's)");
  if (const double a = num("lora_alpha"); a != cfg.f("lora.alpha"))
    throw Error(cj.string() + ": lora_alpha = " + std::to_string(a) + ", but lora.alpha = " + std::to_string(cfg.f("lora.alpha")) +
                " (set lora.alpha to the adapter's)");
  if (!j.contains("base_model_name_or_path") || !j["base_model_name_or_path"].is_string() ||
      !fs::is_directory(j["base_model_name_or_path"].get<std::string>()) &&
          !fs::is_regular_file(j["base_model_name_or_path"].get<std::string>()))
    throw Error(cj.string() + ": base_model_name_or_path must name the base on this machine (an HF directory or a "
                "checkpoint); edit it to the local path of the base");
  return j["base_model_name_or_path"].get<std::string>();
}

std::string peft_adapter_base_xxh64(const std::string& dir) {
  const fs::path p = fs::path(dir) / "sparsebalance_lora.json";
  if (!fs::exists(p)) return "";
  try {
    std::ifstream in(p);
    return nlohmann::json::parse(in).at("base_xxh64").get<std::string>();
  } catch (const std::exception& e) {
    throw Error(p.string() + ": no base_xxh64 string: " + e.what());
  }
}

std::vector<float> read_peft_adapter(const std::string& dir, const Model<float>& m) {
  const std::string path = (fs::path(dir) / "adapter_model.safetensors").string();
  SafetensorsFile f(path);
  std::vector<float> w(m.weights().size());
  std::set<std::string> used;
  for (const auto& p : m.params()) {
    const std::string name = "base_model.model." + p.name;
    const StTensor* t = f.find(name);
    if (!t)
      throw Error(path + ": has no tensor '" + name + "', which this run trains (lora.targets, lora.train_also)");
    if (t->shape != p.shape) throw Error(path + ": tensor '" + name + "' has another shape than this run's (lora.rank, the base's shape)");
    f.read_f32(*t, std::span<float>(w.data() + p.offset, p.size));
    used.insert(name);
  }
  for (const auto& t : f.tensors())
    if (!used.count(t.name) && !(m.shape().tied && t.name == "base_model.model.lm_head.weight"))
      throw Error(path + ": tensor '" + t.name + "' is not one this run trains (lora.targets = the adapter's "
                  "target_modules, lora.train_also = its modules_to_save?)");
  return w;
}

}  // namespace sb
