// sparsebalance convert: Hugging Face model directory <-> SparseBalance checkpoint (io/SAFETENSORS.md).
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "src/cli/args.hpp"
#include "src/common/error.hpp"
#include "src/model/hf.hpp"

namespace sb {

namespace fs = std::filesystem;

// "5000000000", "5GB", "200KB", "1.5MB" (decimal units, as save_pretrained's max_shard_size).
static uint64_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = -1;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
  }
  std::string unit = s.substr(pos);
  double mul = unit.empty() || unit == "B" ? 1 : unit == "KB" ? 1e3 : unit == "MB" ? 1e6 : unit == "GB" ? 1e9 : -1;
  if (v <= 0 || mul < 0 || !std::isfinite(v))
    throw Error("--shard-size " + s + ": expected a positive size in bytes, e.g. 5GB, 200MB or 1000000");
  return uint64_t(v * mul);
}

// HF directory -> checkpoint at step 0: the model's [model] keys from config.json (the rest of the
// config at defaults or --set), parameters in float32, AdamW moments zero (a fresh optimizer state).
static void import_hf(const std::string& src, const std::string& dst, const Args& args) {
  const std::string cfg_path = (fs::path(src) / "config.json").string();
  HfModel hf = read_hf_config(src);
  check_supported(hf, cfg_path);
  Config cfg = Config::load("", args.sets);
  for (const auto& s : args.sets)
    if (s.starts_with("model."))
      throw Error("--set " + s + ": the [model] keys come from " + cfg_path + "; set other sections only");
  set_model_keys(hf, cfg, cfg_path);
  Model<float> model(ModelDims::from_config(cfg, 0));
  SafetensorsDir st(src);  // every header checked before any tensor is read
  read_hf_weights(st, model);

  Checkpoint ck;
  ck.step = 0;
  ck.config_toml = cfg.to_toml();
  for (const auto& p : model.params()) ck.tensors.push_back({p.name, p.shape, p.offset, p.size});
  ck.params = std::move(model.weights());
  ck.m.assign(ck.params.size(), 0.0f);
  ck.v.assign(ck.params.size(), 0.0f);
  write_checkpoint(dst, ck);
  std::printf("convert: %s (%s, %lld parameters, %d layers, d_model %d, vocab %d, %s head) -> %s (step 0, zero AdamW moments)\n",
              src.c_str(), hf.architecture.c_str(), static_cast<long long>(ck.params.size()), hf.dims.n_layers,
              hf.dims.d_model, hf.dims.vocab, hf.dims.tied ? "tied" : "untied", dst.c_str());
}

// Checkpoint -> HF directory: config.json + model.safetensors (or shards and an index), written in
// DST.tmp and renamed to DST when complete.
static void export_hf(const std::string& src, const std::string& dst, const Args& args) {
  const StDtype dtype = parse_st_dtype(args.get("dtype", "bf16"), "--dtype");
  const uint64_t shard = args.has("shard-size") ? parse_bytes(args.get("shard-size")) : kDefaultShardBytes;
  if (!args.sets.empty()) throw Error("--set: a checkpoint -> HF conversion takes the model from the checkpoint");
  Checkpoint ck = read_checkpoint(src);
  Config cfg = Config::from_text(ck.config_toml, src + " (stored config)");
  int64_t embed_rows = 0;
  for (const auto& t : ck.tensors)
    if (t.name == "model.embed_tokens.weight" && !t.shape.empty()) embed_rows = t.shape[0];
  const ModelDims dims = ModelDims::from_config(cfg, embed_rows);
  {  // the stored [model] keys must describe the stored tensors, or config.json would lie
    Model<float> layout(dims);
    const auto& ps = layout.params();
    if (ps.size() != ck.tensors.size())
      throw Error(src + ": holds " + std::to_string(ck.tensors.size()) + " tensors, its stored [model] settings give " +
                  std::to_string(ps.size()));
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i].name != ck.tensors[i].name || ps[i].shape != ck.tensors[i].shape)
        throw Error(src + ": tensor '" + ck.tensors[i].name + "' does not match its stored [model] settings ('" +
                    ps[i].name + "')");
  }
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
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error(tmp + ": cannot create: " + ec.message());
  std::vector<std::string> files;
  try {
    files = write_safetensors_dir(tmp, out, dtype, shard);
    write_text_file((fs::path(tmp) / "config.json").string(), hf_config_json(cfg, dims, dtype));
    if (fs::exists(dst)) fs::remove_all(dst);  // --overwrite was checked by the caller
    fs::rename(tmp, dst);
  } catch (const std::exception& e) {
    fs::remove_all(tmp, ec);
    throw Error(dst + ": export failed, nothing written: " + e.what());
  }
  std::printf("convert: %s (step %lld, %zu parameters) -> %s (LlamaForCausalLM, %s, %zu file(s)", src.c_str(),
              static_cast<long long>(ck.step), ck.params.size(), dst.c_str(), st_dtype_name(dtype), files.size());
  for (const auto& f : files) std::printf(" %s", f.c_str());
  std::printf(" + config.json)\n");
}

static int run_convert(const Args& args) {
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size > 1) throw Error("convert runs on one rank (got " + std::to_string(size) + "); start it without mpirun -np");
  if (args.positional.size() != 2)
    throw Error("convert: expected SRC DST (an HF directory and a checkpoint .h5, or the other way round), got " +
                std::to_string(args.positional.size()) + " argument(s)");
  const std::string src = args.positional[0], dst = args.positional[1];
  if (!fs::exists(src)) throw Error(src + ": does not exist (SRC: an HF model directory or a checkpoint .h5)");
  if (fs::exists(dst) && !args.has("overwrite"))
    throw Error(dst + ": already exists; choose another DST or pass --overwrite");
  if (fs::is_directory(src)) {
    if (args.has("dtype") || args.has("shard-size"))
      throw Error("--dtype and --shard-size apply to checkpoint -> HF; a checkpoint stores float32");
    if (fs::is_directory(dst)) throw Error(dst + ": is a directory; for an HF SRC, DST is the checkpoint file to write");
    import_hf(src, dst, args);
  } else {
    if (fs::exists(dst) && !fs::is_directory(dst))
      throw Error(dst + ": is a file; for a checkpoint SRC, DST is the HF directory to write");
    export_hf(src, dst, args);
  }
  return 0;
}

Command cmd_convert() {
  return {"convert",
          "Hugging Face model directory <-> checkpoint (safetensors, config.json)",
          "convert SRC DST [--dtype bf16|f16|f32] [--shard-size SIZE] [--overwrite] [--set key=value]...\n\n"
          "SRC an HF directory (config.json + model.safetensors, or shards with model.safetensors.index.json)\n"
          "-> DST a checkpoint .h5 at step 0 with zero AdamW moments; its stored config holds the [model]\n"
          "keys from config.json (--set may give the other sections, e.g. data.path), so `eval --checkpoint\n"
          "DST` needs no CONFIG. SRC a checkpoint .h5 -> DST an HF directory\n"
          "(config.json as LlamaForCausalLM + model.safetensors, shards and an index above --shard-size)\n"
          "that transformers loads as is. HF -> checkpoint -> HF is bit-exact in the same dtype.\n"
          "Supported: LlamaForCausalLM, MistralForCausalLM (sliding_window null); fields the model cannot\n"
          "honour are refused, naming the field, before anything is written. See io/SAFETENSORS.md.\n",
          {{"dtype", 1, "checkpoint -> HF: tensor type written (default bf16)", "bf16|f16|f32"},
           {"shard-size", 1, "checkpoint -> HF: largest safetensors file before sharding (default 5GB)", "SIZE"},
           {"overwrite", 0, "replace an existing DST (written aside, then swapped in)"}},
          run_convert};
}

}  // namespace sb
