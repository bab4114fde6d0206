// Hugging Face model directories <-> checkpoints (what `sparsebalance convert` runs; see
// io/SAFETENSORS.md). All checks (config.json fields, every safetensors header, names, shapes,
// values) run before anything is written; outputs go to a temporary name and are renamed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "src/config/config.hpp"
#include "src/hf/hf_config.hpp"
#include "src/model/model.hpp"

namespace sb {

// Reads the parameters of `layout` (flat, `w` holds layout.size values) from the safetensors of
// an HF directory: every parameter must be there with its shape, and nothing else may be (a tied
// lm_head.weight equal to the embedding and rotary inv_freq buffers are tolerated). Errors name
// the file and the tensor.
// What an import does with NaN or inf weights: refuse naming the tensor (default), or warn naming it.
enum class NonFinite { Error, Warn };
void read_hf_weights(const SafetensorsDir& st, const ParamLayout& layout, bool tied, std::vector<float>& w,
                     NonFinite nonfinite = NonFinite::Error);
// The shape checks of read_hf_weights without reading a value: run before the weights' memory is
// taken, so a config.json claiming a huge model fails on the first wrong shape, naming it.
void check_hf_shapes(const SafetensorsDir& st, const ParamLayout& layout, bool tied);

// An HF directory read: config.json's [model] keys set on `base` (whose `base_sets` must not set
// model.* themselves), the weights in float32 in the layout of those keys.
struct HfImport {
  HfModel hf;
  Config cfg;
  ParamLayout layout;
  std::vector<float> weights;
};
HfImport import_hf(const std::string& dir, const Config& base, const std::vector<std::string>& base_sets,
                   NonFinite nonfinite = NonFinite::Error);

// HF directory -> checkpoint at step 0 with zero AdamW moments (a fresh optimizer state); `sets`
// are --set overrides of the non-model sections stored with it. Returns a line for the user.
// An existing DST is replaced only when `overwrite`, and only when it is a checkpoint; DST may not
// name a directory (nor end in '/') or one of SRC's files.
std::string hf_to_checkpoint(const std::string& src, const std::string& dst, const std::vector<std::string>& sets,
                             bool overwrite = false, NonFinite nonfinite = NonFinite::Error);

// Checkpoint -> HF directory (config.json + safetensors in `dtype`, sharded above shard_bytes).
// DST (normalised first: "hf/", "hf/.", ".") may not hold SRC. Writes only the export's own files,
// staged and moved into place together, into a new or empty DST or, with `overwrite`, an existing
// one, where everything else is kept (io/RELIABILITY.md, "What convert --overwrite replaces").
// `merge` (a LoRA checkpoint, required for one): the base with the adapters folded in, W + (alpha /
// rank) B A, and the train_also parts trained (hf_lora.hpp); the base from `base` when given, else
// the one the checkpoint names, its XXH64 checked.
std::string checkpoint_to_hf(const std::string& src, const std::string& dst, StDtype dtype, uint64_t shard_bytes,
                             bool overwrite, bool merge = false, const std::string& base = "");

// train --init-from PATH (an HF directory or a checkpoint): weights only. Sets the shape keys of
// `cfg` (model.n_layers, d_model, n_heads, n_kv_heads, ffn_dim, vocab_size, rope_theta, norm_eps,
// tie_embeddings, qkv_bias, qk_norm, head_dim) from PATH; a `--set model.*` among `sets` that contradicts
// PATH is an error, and `notes` receives a line for each non-default config value that PATH replaced.
// The RoPE scaling (model.rope_scaling.*) is PATH's unless the run sets any of those keys to a
// non-default value (its own scaling, to extend the context; noted). Returns the weights in the
// layout of the resulting [model] keys.
std::vector<float> init_weights_from(const std::string& path, Config& cfg, const std::vector<std::string>& sets,
                                     std::vector<std::string>* notes = nullptr);

}  // namespace sb
