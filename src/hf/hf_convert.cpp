#include "src/hf/hf_convert.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "base/error.hpp"
#include "io/h5.hpp"
#include "src/hf/hf_lora.hpp"
#include "src/train/settings.hpp"

namespace sb {

namespace fs = std::filesystem;

void check_hf_shapes(const SafetensorsDir& st, const ParamLayout& layout, bool tied) {
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
    used.insert(p.name);
  }
  for (const auto& name : st.names()) {
    if (used.count(name) || name.ends_with(".rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && tied) continue;  // read_hf_weights checks it is a copy of the embedding
    throw Error(st.get(name).first->path() + ": unexpected tensor '" + name +
                "': the model (from config.json) has no such parameter");
  }
}

void read_hf_weights(const SafetensorsDir& st, const ParamLayout& layout, bool tied, std::vector<float>& w,
                     NonFinite nonfinite) {
  if (w.size() != layout.size) throw std::logic_error("read_hf_weights: buffer and layout differ");
  check_hf_shapes(st, layout, tied);
  std::set<std::string> used;
  for (const auto& p : layout.params) {
    auto [file, t] = st.get(p.name);
    file->read_f32(*t, std::span<float>(w.data() + p.offset, p.size));
    used.insert(p.name);
    // NaN or inf weights make every loss NaN: named here, where the tensor is known.
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < p.size; ++i)
      if (!std::isfinite(w[p.offset + i]) && bad++ == 0) first = i;
    if (bad == 0) continue;
    const std::string what = file->path() + ": tensor '" + p.name + "' holds " + std::to_string(bad) +
                             " non-finite value(s) (NaN or inf; the first at flat index " + std::to_string(first) +
                             ", " + std::to_string(w[p.offset + first]) + ")";
    if (nonfinite == NonFinite::Error)
      throw Error(what + "; nothing was written (convert --nonfinite warn imports it anyway)");
    std::fprintf(stderr, "warning: %s; imported as is (--nonfinite warn)\n", what.c_str());
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

HfImport import_hf(const std::string& dir, const Config& base, const std::vector<std::string>& base_sets,
                   NonFinite nonfinite) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  for (const auto& s : base_sets)
    if (s.starts_with("model."))
      throw Error("--set " + s + ": the [model] keys come from " + cfg_path + "; set other sections only");
  HfImport im{read_hf_config(dir), base, {}, {}};
  set_model_keys(im.hf, im.cfg, cfg_path);
  const ModelDims dims = model_dims(im.cfg, 0);
  im.layout = ParamLayout(dims);
  SafetensorsDir st(dir);  // every header checked before any tensor is read
  check_hf_shapes(st, im.layout, dims.tied);  // before the model's memory is taken: config.json may claim any size
  im.weights.assign(im.layout.size, 0.0f);
  read_hf_weights(st, im.layout, dims.tied, im.weights, nonfinite);
  return im;
}

// A path as the file system sees it: absolute, "." and ".." and a trailing '/' resolved, symlinks
// of its existing part followed. Checks of DST against SRC compare these, before anything is touched.
static fs::path real_path(const std::string& p) {
  fs::path a = fs::absolute(p).lexically_normal();
  if (!a.has_filename() && a.has_parent_path() && a != a.root_path()) a = a.parent_path();  // "x/" -> "x"
  std::error_code ec;
  const fs::path w = fs::weakly_canonical(a, ec);
  return ec ? a : w;
}

// `inner` is `outer` or lies under it.
static bool within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

std::string hf_to_checkpoint(const std::string& src, const std::string& dst, const std::vector<std::string>& sets,
                             bool overwrite, NonFinite nonfinite) {
  const fs::path sp = real_path(src), dp = real_path(dst);
  std::error_code ec;
  if (dst.empty() || dst.back() == '/' || fs::is_directory(dp, ec) || dp.filename() == "." || dp.filename() == "..")
    throw Error("DST " + dst + ": names a directory; for an HF SRC, DST is the checkpoint file to write (e.g. model.h5)");
  if (dp.parent_path() == sp &&
      (dp.filename() == "config.json" || dp.filename().string().ends_with(".safetensors") ||
       dp.filename() == "model.safetensors.index.json"))
    throw Error("DST " + dst + ": is a file of SRC " + src + "; choose a DST outside the files convert reads");
  if (fs::exists(dp, ec)) {
    if (!overwrite) throw Error(dst + ": already exists; choose another DST or pass --overwrite");
    try {  // --overwrite replaces a checkpoint, never another file
      h5::Id f = h5::open_read(dp.string(), "a checkpoint");
      h5::check_format(f, dst, kCheckpointFormat, kCheckpointVersion, "a checkpoint");
    } catch (const Error& e) {
      throw Error(dst + ": --overwrite replaces only a sparsebalance checkpoint, and this is not one (" + e.what() +
                  "); nothing was written");
    }
  }
  HfImport im = import_hf(src, Config::load("", sets), sets, nonfinite);
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
                             bool overwrite, bool merge, const std::string& base) {
  // DST normalised before anything is touched: "hf/", "hf/." and "." name the directories themselves.
  const fs::path s = real_path(src), d = real_path(dst);
  std::error_code ec;
  if (within(s, d))
    throw Error("DST " + dst + " (" + d.string() + ") holds SRC " + src +
                ": the export writes into DST; choose a directory that does not hold the checkpoint");
  if (fs::exists(d, ec) && !fs::is_directory(d, ec))
    throw Error(dst + ": is a file; for a checkpoint SRC, DST is the HF directory to write");
  const bool existed = fs::exists(d, ec);
  if (existed && !overwrite && !fs::is_empty(d, ec))
    throw Error(dst + ": already exists; choose another DST or pass --overwrite (which replaces the export's own "
                "files, config.json, model*.safetensors and the index, and keeps everything else)");
  Checkpoint ck = read_checkpoint(src);
  Config cfg = Config::from_text(ck.config_toml, src + " (stored config)");
  int64_t embed_rows = 0;
  for (const auto& t : ck.tensors)
    if (t.name == "model.embed_tokens.weight" && !t.shape.empty()) embed_rows = t.shape[0];
  const bool lora = lora_spec(cfg).on();
  if (merge != lora)
    throw Error(merge ? "--merge: " + src + " is not a LoRA checkpoint (lora.rank = 0); export it without --merge"
                      : src + ": a LoRA checkpoint (lora.rank = " + std::to_string(cfg.i("lora.rank")) +
                            "): export the PEFT adapter (convert SRC DST) or the merged model (convert SRC DST --merge)");
  if (lora) embed_rows = read_lora_base_ref(src).vocab;
  const ModelDims dims = model_dims(cfg, embed_rows);
  // LoRA --merge: the base's tensors with the adapters folded in (hf_lora.hpp), in the base layout
  std::vector<float> merged;
  std::vector<CheckpointTensor> tensors = ck.tensors;
  if (lora) {
    merged = lora_merged_weights(src, ck, cfg, base);
    tensors.clear();
    for (const auto& p : ParamLayout(dims).params) tensors.push_back({p.name, p.shape, p.offset, p.size});
  } else {
    check_stored_layout(ck, ParamLayout(dims), src);  // or config.json would lie
  }
  const std::vector<float>& values = lora ? merged : ck.params;
  std::vector<StOut> out;
  for (const auto& t : tensors) {
    std::span<const float> data(values.data() + t.offset, t.size);
    for (float x : data)
      if (!std::isfinite(x) || (dtype == StDtype::F16 && std::fabs(x) > 65504.0f))
        throw Error(src + ": tensor '" + t.name + "' holds " + std::to_string(x) +
                    (std::isfinite(x) ? ", beyond float16's range (use --dtype bf16 or f32)" : ": not a finite value") +
                    "; nothing was written");
    out.push_back({t.name, t.shape, data});
  }

  // The export's own files are written beside their final names (hidden temporaries, fsynced) and
  // moved into place together; nothing else in DST is touched. A previous export's files that
  // this one does not write (model.safetensors against shards, shards beyond the new count, both
  // named by the old index) are removed after, so transformers never loads a mix.
  const char* torch_dtype = dtype == StDtype::BF16 ? "bfloat16" : dtype == StDtype::F16 ? "float16" : "float32";
  fs::create_directories(d, ec);
  if (ec) throw Error(dst + ": cannot create: " + ec.message());
  const std::vector<std::string> old_shards = indexed_shards(d.string());
  std::vector<std::string> files;
  try {
    Staged stage;
    files = write_safetensors_dir(d.string(), out, dtype, shard_bytes, &stage);
    write_text_file((d / "config.json").string(), hf_config_json(cfg, dims, torch_dtype), &stage);
    stage.commit();
  } catch (const std::exception& e) {
    if (!existed) fs::remove(d, ec);  // only when empty: a directory this run made
    throw Error(dst + ": export failed, nothing in it changed: " + e.what());
  }
  std::vector<std::string> stale = old_shards;
  stale.push_back("model.safetensors"), stale.push_back("model.safetensors.index.json");
  std::string removed;
  for (const auto& name : stale) {
    const bool shard_name = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                            (name.starts_with("model-") && name.ends_with(".safetensors") && name.find('/') == std::string::npos);
    if (!shard_name || std::find(files.begin(), files.end(), name) != files.end()) continue;
    if (fs::is_regular_file(d / name, ec) && fs::remove(d / name, ec)) removed += " " + name;
  }
  if (!removed.empty()) std::printf("convert: removed the previous export's files that this one replaces:%s\n", removed.c_str());
  std::string line = src + " (step " + std::to_string(ck.step) + ", " + std::to_string(values.size()) +
                     (lora ? " parameters, LoRA merged) -> " : " parameters) -> ") + dst + " (" + hf_architecture(dims) + ", " + st_dtype_name(dtype) + ":";
  for (const auto& f : files) line += " " + f;
  return line + " + config.json)";
}

static const char* const kShapeKeys[] = {"model.n_layers",   "model.d_model",    "model.n_heads",
                                         "model.n_kv_heads", "model.ffn_dim",    "model.vocab_size",
                                         "model.rope_theta", "model.norm_eps",   "model.tie_embeddings",
                                         "model.qkv_bias", "model.qk_norm",     "model.head_dim"};
// The RoPE scaling: PATH's, unless this run sets its own (a value other than the default, from the
// config file or --set), e.g. to extend the model's context.
static const char* const kRopeKeys[] = {
    "model.rope_scaling.type",      "model.rope_scaling.factor",
    "model.rope_scaling.original_max_position_embeddings",
    "model.rope_scaling.low_freq_factor", "model.rope_scaling.high_freq_factor",
    "model.rope_scaling.beta_fast", "model.rope_scaling.beta_slow",
    "model.rope_scaling.attention_factor", "model.rope_scaling.truncate", "model.rope_scaling.field"};

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
    case KeyType::Sources: return "";  // no model key is a list
  }
  return "";
}

std::vector<float> init_weights_from(const std::string& path, Config& cfg, const std::vector<std::string>& sets,
                                     std::vector<std::string>* notes) {
  // `from`: PATH's [model] keys; `weights` in their layout.
  Config from;
  std::vector<float> weights;
  if (fs::is_directory(path)) {
    HfImport im = import_hf(path, Config(), {}, NonFinite::Error);
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
  bool own_rope = false;  // the run gives a scaling of its own: all of its rope_scaling keys stand
  for (const char* k : kRopeKeys) own_rope |= value_text(cfg, k) != value_text(defaults, k);
  if (own_rope) {
    if (notes && value_text(cfg, kRopeKeys[0]) != value_text(from, kRopeKeys[0]))
      notes->push_back(std::string("model.rope_scaling.type = ") + value_text(cfg, kRopeKeys[0]) + " (this run's) instead of " +
                       value_text(from, kRopeKeys[0]) + " from " + path);
  } else {
    for (const char* k : kRopeKeys) cfg.set(k, value_text(from, k), "--init-from " + path);
  }
  return weights;
}

}  // namespace sb
