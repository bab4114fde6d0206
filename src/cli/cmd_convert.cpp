// sparsebalance convert: Hugging Face model directory <-> SparseBalance checkpoint (io/SAFETENSORS.md).
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "src/cli/args.hpp"
#include "src/hf/hf_lora.hpp"
#include "base/error.hpp"
#include "src/hf/hf_convert.hpp"

namespace sb {

namespace fs = std::filesystem;

// "5000000000", "5GB", "200KB", "1.5MB" (decimal units, as save_pretrained's max_shard_size), from
// 1 byte to 1e18 (beyond any model; a larger number would wrap when converted).
static uint64_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = -1;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
  }
  std::string unit = s.substr(pos);
  double mul = unit.empty() || unit == "B" ? 1 : unit == "KB" ? 1e3 : unit == "MB" ? 1e6 : unit == "GB" ? 1e9 : -1;
  const double bytes = v * mul;
  if (!(v > 0) || mul < 0 || !std::isfinite(bytes) || bytes < 1 || bytes > 1e18)
    throw Error("--shard-size " + s + ": expected a size from 1 byte to 1e18 bytes (1000PB), e.g. 5GB, 200MB or 1000000");
  return uint64_t(bytes);
}

static int run_convert(const Args& args) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) throw Error("convert runs on one rank (got " + std::to_string(size) + "); start it without mpirun -np");
  if (args.positional.size() != 2)
    throw Error("convert: expected SRC DST (an HF directory and a checkpoint .h5, or the other way round), got " +
                std::to_string(args.positional.size()) + " argument(s)");
  const std::string src = args.positional[0], dst = args.positional[1];
  if (!fs::exists(src)) throw Error(src + ": does not exist (SRC: an HF model directory or a checkpoint .h5)");
  if (fs::is_directory(src)) {
    const std::string nf = args.get("nonfinite", "error");
    if (nf != "error" && nf != "warn") throw Error("--nonfinite " + nf + ": expected error or warn");
    if (args.has("dtype") || args.has("shard-size"))
      throw Error("--dtype and --shard-size apply to checkpoint -> HF; a checkpoint stores float32");
    if (fs::is_directory(dst)) throw Error(dst + ": is a directory; for an HF SRC, DST is the checkpoint file to write");
    std::printf("convert: %s\n", hf_to_checkpoint(src, dst, args.sets, args.has("overwrite"),
                                                               nf == "warn" ? NonFinite::Warn : NonFinite::Error).c_str());
  } else {
    if (fs::exists(dst) && !fs::is_directory(dst))
      throw Error(dst + ": is a file; for a checkpoint SRC, DST is the HF directory to write");
    if (!args.sets.empty()) throw Error("--set: a checkpoint -> HF conversion takes the model from the checkpoint");
    if (args.has("nonfinite")) throw Error("--nonfinite applies to HF -> checkpoint (an export refuses NaN/inf always)");
    const bool lora = !read_lora_base_ref(src).xxh64.empty();
    if (args.has("base") && !args.has("merge")) throw Error("--base goes with --merge (the base the adapters are folded into)");
    if (lora && !args.has("merge")) {  // the PEFT adapter directory; float32 unless --dtype says otherwise
      if (args.has("shard-size")) throw Error("--shard-size: a PEFT adapter is one adapter_model.safetensors");
      const StDtype dtype = parse_st_dtype(args.get("dtype", "f32"), "--dtype");
      std::printf("convert: %s\n", lora_to_peft(src, dst, dtype, args.has("overwrite")).c_str());
      return 0;
    }
    const StDtype dtype = parse_st_dtype(args.get("dtype", "bf16"), "--dtype");
    const uint64_t shard = args.has("shard-size") ? parse_bytes(args.get("shard-size")) : kDefaultShardBytes;
    std::printf("convert: %s\n", checkpoint_to_hf(src, dst, dtype, shard, args.has("overwrite"), args.has("merge"),
                                                  args.get("base", "")).c_str());
  }
  return 0;
}

Command cmd_convert() {
  return {"convert",
          "Hugging Face model directory <-> checkpoint (safetensors, config.json)",
          "convert SRC DST [--dtype bf16|f16|f32] [--shard-size SIZE] [--nonfinite error|warn] [--overwrite]\n"
          "        [--set key=value]...\n\n"
          "SRC an HF directory (config.json + model.safetensors, or shards with model.safetensors.index.json)\n"
          "-> DST a checkpoint .h5 at step 0 with zero AdamW moments; its stored config holds the [model]\n"
          "keys from config.json (--set may give the other sections, e.g. data.path), so `eval --checkpoint\n"
          "DST` needs no CONFIG. SRC a checkpoint .h5 -> DST an HF directory\n"
          "(config.json as LlamaForCausalLM, or Qwen2ForCausalLM with q/k/v biases, + model.safetensors,\n"
          "shards and an index above --shard-size)\n"
          "that transformers loads as is. HF -> checkpoint -> HF is bit-exact in the same dtype.\n"
          "Supported: LlamaForCausalLM, MistralForCausalLM (sliding_window null), Qwen2ForCausalLM (q/k/v\n"
          "biases, use_sliding_window false); fields the model cannot\n"
          "honour are refused, naming the field, before anything is written. See io/SAFETENSORS.md.\n"
          "--overwrite into an HF directory replaces config.json, model*.safetensors and the index and keeps\n"
          "every other file (a tokenizer.json copied there stays); DST may not hold SRC (io/RELIABILITY.md).\n"
          "SRC a LoRA checkpoint (lora.rank > 0) -> DST a PEFT adapter directory (adapter_config.json,\n"
          "adapter_model.safetensors in f32 unless --dtype, sparsebalance_lora.json) that\n"
          "peft.PeftModel.from_pretrained loads on the base; with --merge, the full HF model with the\n"
          "adapters folded in (W + (alpha/rank) B A), the base found where the checkpoint says or at --base\n"
          "and checked against its XXH64 (src/model/README.md, \"LoRA\").\n",
          {{"dtype", 1, "checkpoint -> HF: tensor type written (default bf16)", "bf16|f16|f32"},
           {"shard-size", 1, "checkpoint -> HF: largest safetensors file before sharding (default 5GB)", "SIZE"},
           {"nonfinite", 1, "HF -> checkpoint: NaN/inf weights are an error naming the tensor (default) or a warning", "error|warn"},
           {"merge", 0, "a LoRA checkpoint -> a full HF model with W + (alpha/rank) B A folded in (without: a PEFT adapter directory)"},
           {"base", 1, "with --merge: the base (HF directory or checkpoint) when not where the LoRA checkpoint says; its XXH64 is checked", "PATH"},
           {"overwrite", 0, "write into an existing DST: replaces the export's own files only (io/RELIABILITY.md)"}},
          run_convert, kSetFlag};
}

}  // namespace sb
