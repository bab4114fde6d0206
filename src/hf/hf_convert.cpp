#include "src/hf/hf_convert.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "base/error.hpp"
#include "src/train/settings.hpp"

namespace sb {

namespace fs = std::filesystem;

void read_hf_weights(const SafetensorsDir& st, const ParamLayout& layout, bool tied, std::vector<float>& w) {
  if (w.size() != layout.size) throw std::logic_error("read_hf_weights: buffer and layout differ");
  std::set<std::string> used;
  for (const auto& p : layout.params) {
    auto [file, t] = st.get(p.name);
    if (t->shape != p.shape) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string o = "[";
        for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
        return o + "]";
      };
      throw Error(file->path() + ": tensor '" + p.name + "' has shape " + str(t->shape) + ", config.json gives " +
                  str(p.shape));
    }
    file->read_f32(*t, std::span<float>(w.data() + p.offset, p.size));
    used.insert(p.name);
  }
  for (const auto& name : st.names()) {
    if (used.count(name)) continue;
    auto [file, t] = st.get(name);
    if (name.ends_with(".rotary_emb.inv_freq")) continue;  // a buffer older transformers saved; derived from rope_theta
    if (name == "lm_head.weight" && tied) {
      // Some tied checkpoints store the head anyway; transformers ignores it. Accept only a true copy.
      const auto& e = layout.params[layout.embed];
      std::vector<float> head(t->numel());
      if (t->shape == e.shape) file->read_f32(*t, head);
      if (t->shape == e.shape && std::memcmp(head.data(), w.data() + e.offset, e.size * 4) == 0) continue;
      throw Error(file->path() + ": tensor 'lm_head.weight' differs from model.embed_tokens.weight, but config.json "
                                 "says tie_word_embeddings = true");
    }
    throw Error(file->path() + ": unexpected tensor '" + name + "': the model (from config.json) has no such parameter");
  }
}

HfImport import_hf(const std::string& dir, const Config& base, const std::vector<std::string>& base_sets) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  for (const auto& s : base_sets)
    if (s.starts_with("model."))
      throw Error("--set " + s + ": the [model] keys come from " + cfg_path + "; set other sections only");
  HfImport im{read_hf_config(dir), base, {}, {}};
  set_model_keys(im.hf, im.cfg, cfg_path);
  const ModelDims dims = model_dims(im.cfg, 0);
  im.layout = ParamLayout(dims);
  SafetensorsDir st(dir);  // every header checked before any tensor is read
  im.weights.assign(im.layout.size, 0.0f);
  read_hf_weights(st, im.layout, dims.tied, im.weights);
  return im;
}

std::string hf_to_checkpoint(const std::string& src, const std::string& dst, const std::vector<std::string>& sets,
                             bool overwrite) {
  if (fs::exists(dst) && !overwrite) throw Error(dst + ": already exists; choose another DST or pass --overwrite");
  HfImport im = import_hf(src, Config::load("", sets), sets);
  Checkpoint ck;
  ck.step = 0;
  ck.config_toml = im.cfg.to_toml();
  for (const auto& p : im.layout.params) ck.tensors.push_back({p.name, p.shape, p.offset, p.size});
  ck.params = std::move(im.weights);
  ck.m.assign(ck.params.size(), 0.0f);
  ck.v.assign(ck.params.size(), 0.0f);
  write_checkpoint(dst, ck);
  const ModelDims& d = im.hf.dims;
  return src + " (" + im.hf.architecture + ", " + std::to_string(ck.params.size()) + " parameters, " +
         std::to_string(d.n_layers) + " layers, d_model " + std::to_string(d.d_model) + ", vocab " +
         std::to_string(d.vocab) + ", " + (d.tied ? "tied" : "untied") + " head) -> " + dst +
         " (step 0, zero AdamW moments)";
}

// The checkpoint's tensors are those its stored [model] keys give, in order.
static void check_stored_layout(const Checkpoint& ck, const ParamLayout& layout, const std::string& path) {
  const auto& ps = layout.params;
  if (ps.size() != ck.tensors.size())
    throw Error(path + ": holds " + std::to_string(ck.tensors.size()) + " tensors, its stored [model] settings give " +
                std::to_string(ps.size()));
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i].name != ck.tensors[i].name || ps[i].shape != ck.tensors[i].shape)
      throw Error(path + ": tensor '" + ck.tensors[i].name + "' does not match its stored [model] settings ('" +
                  ps[i].name + "')");
}

std::string checkpoint_to_hf(const std::string& src, const std::string& dst, StDtype dtype, uint64_t shard_bytes,
                             bool overwrite) {
  if (fs::exists(dst) && !overwrite) throw Error(dst + ": already exists; choose another DST or pass --overwrite");
  Checkpoint ck = read_checkpoint(src);
  Config cfg = Config::from_text(ck.config_toml, src + " (stored config)");
  int64_t embed_rows = 0;
  for (const auto& t : ck.tensors)
    if (t.name == "model.embed_tokens.weight" && !t.shape.empty()) embed_rows = t.shape[0];
  const ModelDims dims = model_dims(cfg, embed_rows);
  check_stored_layout(ck, ParamLayout(dims), src);  // or config.json would lie
  std::vector<StOut> out;
  for (const auto& t : ck.tensors) {
    std::span<const float> data(ck.params.data() + t.offset, t.size);
    for (float x : data)
      if (!std::isfinite(x) || (dtype == StDtype::F16 && std::fabs(x) > 65504.0f))
        throw Error(src + ": tensor '" + t.name + "' holds " + std::to_string(x) +
                    (std::isfinite(x) ? ", beyond float16's range (use --dtype bf16 or f32)" : ": not a finite value") +
                    "; nothing was written");
    out.push_back({t.name, t.shape, data});
  }

  const std::string tmp = dst + ".tmp";
  const char* torch_dtype = dtype == StDtype::BF16 ? "bfloat16" : dtype == StDtype::F16 ? "float16" : "float32";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error(tmp + ": cannot create: " + ec.message());
  std::vector<std::string> files;
  try {
    files = write_safetensors_dir(tmp, out, dtype, shard_bytes);
    write_text_file((fs::path(tmp) / "config.json").string(), hf_config_json(cfg, dims, torch_dtype));
    if (fs::exists(dst)) fs::remove_all(dst);
    fs::rename(tmp, dst);
  } catch (const std::exception& e) {
    fs::remove_all(tmp, ec);
    throw Error(dst + ": export failed, nothing written: " + e.what());
  }
  std::string line = src + " (step " + std::to_string(ck.step) + ", " + std::to_string(ck.params.size()) +
                     " parameters) -> " + dst + " (" + hf_architecture(dims) + ", " + st_dtype_name(dtype) + ":";
  for (const auto& f : files) line += " " + f;
  return line + " + config.json)";
}

static const char* const kShapeKeys[] = {"model.n_layers",   "model.d_model",    "model.n_heads",
                                         "model.n_kv_heads", "model.ffn_dim",    "model.vocab_size",
                                         "model.rope_theta", "model.norm_eps",   "model.tie_embeddings",
                                         "model.qkv_bias"};

static std::string value_text(const Config& c, const std::string& key) {
  switch (find_key(key)->type) {
    case KeyType::Int: return std::to_string(c.i(key));
    case KeyType::Float: {
      char b[40];
      std::snprintf(b, sizeof b, "%.17g", c.f(key));
      return b;
    }
    case KeyType::Bool: return c.b(key) ? "true" : "false";
    case KeyType::String: return c.s(key);
  }
  return "";
}

std::vector<float> init_weights_from(const std::string& path, Config& cfg, const std::vector<std::string>& sets,
                                     std::vector<std::string>* notes) {
  // `from`: PATH's [model] keys; `weights` in their layout.
  Config from;
  std::vector<float> weights;
  if (fs::is_directory(path)) {
    HfImport im = import_hf(path, Config(), {});
    from = std::move(im.cfg);
    weights = std::move(im.weights);
  } else {
    Checkpoint ck = read_checkpoint(path);
    from = Config::from_text(ck.config_toml, path + " (stored config)");
    for (const auto& t : ck.tensors)  // a run that took its vocabulary from the data stored 0
      if (t.name == "model.embed_tokens.weight" && !t.shape.empty() && from.i("model.vocab_size") == 0)
        from.set("model.vocab_size", std::to_string(t.shape[0]), path);
    check_stored_layout(ck, ParamLayout(model_dims(from, 0)), path);
    weights = std::move(ck.params);
  }
  for (const auto& set : sets) {
    const std::string key = set.substr(0, set.find('='));
    for (const char* k : kShapeKeys) {
      if (key != k) continue;
      Config tmp;
      tmp.set(key, set.substr(set.find('=') + 1), "--set " + set);
      if (value_text(tmp, key) != value_text(from, key))
        throw Error("--set " + set + " contradicts --init-from " + path + ", which has " + key + " = " +
                    value_text(from, key) + " (the model shape comes from PATH; drop the --set)");
    }
  }
  const Config defaults;
  for (const char* k : kShapeKeys) {
    // A value the config file gave (not the default) that PATH overrides is worth a line.
    if (notes && value_text(cfg, k) != value_text(from, k) && value_text(cfg, k) != value_text(defaults, k))
      notes->push_back(std::string(k) + " = " + value_text(cfg, k) + " replaced by " + value_text(from, k) + " from " + path);
    cfg.set(k, value_text(from, k), "--init-from " + path);
  }
  return weights;
}

}  // namespace sb
