// LoRA checkpoints out (src/model/README.md "LoRA"; io/SAFETENSORS.md "LoRA exports"): a PEFT
// adapter directory, or the base with the adapters folded in (what `convert --merge` writes).
#pragma once
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "src/config/config.hpp"
#include "src/model/model.hpp"

namespace sb {

// What a LoRA checkpoint's /lora group says of its base: where it came from (an absolute --init-from
// path, or "random, train.seed = N") and the XXH64 of its float32 weights (16 hex digits).
struct LoraBaseRef {
  std::string base, xxh64;
  int64_t vocab = 0;  // the model's vocabulary (the adapters alone do not show it)
};
// Empty fields when the checkpoint has no /lora group (not a LoRA run).
LoraBaseRef read_lora_base_ref(const std::string& ckpt);
// XXH64 of float32 weights as 16 hex digits (what the trainer stores).
std::string weights_xxh64(const std::vector<float>& w);

// The frozen base of LoRA checkpoint `ckpt` (stored config `cfg`), in the base layout: rebuilt from
// the seed, or read from `override_path` when given, else from the recorded path; its hash must be
// the recorded one (the error names both).
std::vector<float> lora_base_weights(const std::string& ckpt, const Config& cfg, const std::string& override_path = "");

// The merged model of a LoRA checkpoint: W + (alpha / rank) B A, the train_also parts trained;
// base_layout() order of the stored [model] keys.
std::vector<float> lora_merged_weights(const std::string& ckpt, const Checkpoint& ck, const Config& cfg,
                                       const std::string& override_path = "");

// A LoRA checkpoint -> a PEFT adapter directory DST: adapter_config.json, adapter_model.safetensors
// (PEFT's names: base_model.model.<HF name>.lora_A.weight, the train_also parts as modules_to_save),
// and sparsebalance_lora.json (the base's reference and hash). New or empty DST, or `overwrite`.
std::string lora_to_peft(const std::string& src, const std::string& dst, StDtype dtype, bool overwrite);

// train --init-from ADAPTER_DIR (a PEFT LoRA adapter directory, e.g. one lora_to_peft wrote): its
// base, from adapter_config.json's base_model_name_or_path (a local path); the config's lora.rank and
// lora.alpha must be the adapter's r and lora_alpha (errors name both), and use_rslora / use_dora
// are refused. Returns "" when `dir` is not an adapter directory (no adapter_config.json).
std::string peft_adapter_base(const std::string& dir, const Config& cfg);
// The base XXH64 that sparsebalance_lora.json in `dir` records ("" without that file: not our export).
std::string peft_adapter_base_xxh64(const std::string& dir);
// The adapter's tensors in the trainable layout of `m` (a LoRA model): each of m.params() as
// base_model.model.<name> with its shape; a tensor the layout does not have is refused by name
// (another lora.targets or lora.train_also), as is one missing.
std::vector<float> read_peft_adapter(const std::string& dir, const Model<float>& m);

}  // namespace sb
