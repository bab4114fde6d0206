// RoPE scaling: the inverse-frequency table and the attention factor of a model's RoPE, computed
// once per model the way transformers' ROPE_INIT_FUNCTIONS compute them (default, linear, llama3,
// yarn), then passed to the rope kernels (kernels::RopeFreqs). src/model/README.md "RoPE scaling".
#pragma once
#include <string>
#include <vector>

namespace sb {

// model.rope_scaling.* (src/config/schema_model_train.cpp); from config.json's rope_scaling or
// rope_parameters by src/hf/hf_config.cpp.
struct RopeScaling {
  std::string type = "none";      // none | linear | llama3 | yarn
  double factor = 1;              // linear, llama3, yarn: the context multiple
  int original_max_positions = 0; // llama3, yarn: the pre-training context (original_max_position_embeddings)
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  double beta_fast = 32, beta_slow = 1;              // yarn: the ramp's bounds, in rotations
  double attention_factor = 0;    // yarn: cos and sin multiplied by it; 0: 0.1 ln(factor) + 1 (factor > 1, else 1)
  bool truncate = true;           // yarn: the ramp's bounds floored / ceiled to whole dimensions
  bool operator==(const RopeScaling&) const = default;
};

struct RopeTable {
  std::vector<double> inv_freq;  // (head_dim / 2) angle per position of pair d
  double scale = 1;              // attention factor on cos and sin
};

// The table for head size D and base theta. Throws naming model.rope_scaling.<field> when a field
// is out of range (factor < 1... see check_rope_scaling).
RopeTable rope_table(int D, double theta, const RopeScaling& r);
// The checks rope_table applies, on their own (the config and the converter call them first).
void check_rope_scaling(const RopeScaling& r);

}  // namespace sb
