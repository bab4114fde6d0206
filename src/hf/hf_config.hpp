// Hugging Face model directories (config.json + safetensors) <-> the model's [model] keys and
// parameters. The model's parameter names are already Hugging Face's (model.hpp), so the weight
// table is the model's own parameter list (with model.qkv_bias, the q/k/v biases).
//
// Supported: LlamaForCausalLM, MistralForCausalLM without a sliding window, Qwen2ForCausalLM (q/k/v
// biases; its real configs pass), tied or untied head, GQA, any rope_theta / rms_norm_eps,
// head_dim = hidden_size / num_attention_heads. A field the model cannot honour is refused naming
// the field; see io/SAFETENSORS.md.
#pragma once
#include <cstdint>
#include <string>

#include "src/config/config.hpp"
#include "src/model/model.hpp"

namespace sb {

struct HfModel {
  std::string architecture;  // "LlamaForCausalLM", ...
  ModelDims dims;
  int64_t max_position_embeddings = 4096;
  bool qkv_bias = false;     // Qwen2: q/k/v projections carry biases
};

// Parses config.json text; `origin` (its path) names it in errors. Throws sb::Error naming the
// field for anything the model cannot honour (rope_scaling, sliding windows, MoE, biases on o_proj
// or the MLP, activations other than silu, dropout, quantization, an unknown architecture).
HfModel parse_hf_config(const std::string& text, const std::string& origin);
HfModel read_hf_config(const std::string& dir);  // DIR/config.json
// Sets the [model] keys (n_layers, d_model, ..., vocab_size, qkv_bias, max_position_embeddings) in `cfg`.
void set_model_keys(const HfModel& hf, Config& cfg, const std::string& origin);

// config.json for a model of these [model] settings, as LlamaForCausalLM, or Qwen2ForCausalLM when
// the model has q/k/v biases (transformers loads it as is); torch_dtype "bfloat16", "float16" or
// "float32".
const char* hf_architecture(const ModelDims& dims);
std::string hf_config_json(const Config& cfg, const ModelDims& dims, const std::string& torch_dtype);

}  // namespace sb
