// `sparsebalance memory`: a run's memory per rank, planned from the config without running it
// (src/model/README.md "LoRA", "Planning memory"): full fine-tuning against LoRA, ZeRO-1 off and on.
#pragma once
#include <string>
#include <vector>

#include "src/train/settings.hpp"

namespace sb {

struct MemoryPlanRow {
  std::string run;                  // "full, train.zero = 0", "LoRA r 16, train.zero = 1", ...
  double base = 0;                  // bytes: the frozen base (LoRA)
  double weights = 0, grads = 0;    // bytes: the trainable weights (and their device copies), gradients
  double optimizer = 0;             // bytes: AdamW moments (+ ZeRO's master and reduced-gradient slices)
  double activations = -1;          // bytes of one micro-batch's forward/backward; < 0: not modelled
  double total() const { return base + weights + grads + optimizer + (activations > 0 ? activations : 0); }
};

// The four rows (full and LoRA, ZeRO-1 off and on) for `ranks` data-parallel ranks on
// train.device. LoRA: the config's [lora], or rank 16, alpha 32 on every target when lora.rank = 0.
// The parameter state follows the engines' own accounting (the start-of-run memory lines); the
// CPU activations are the CPU model's buffers for one micro-batch of train.micro_batch_tokens;
// the GPU's activations are not modelled.
std::vector<MemoryPlanRow> memory_plan(const Settings& s, int ranks);

}  // namespace sb
