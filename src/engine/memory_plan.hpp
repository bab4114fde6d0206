// `sparsebalance memory`: a run's memory per rank, planned from its settings without running it
// (src/model/README.md "LoRA", "Planning memory"): full fine-tuning against LoRA, ZeRO-1 off and on,
// counted as the engines count their own (update.cpp and engine_cuda.cpp, memory_line).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/engine/engine.hpp"
#include "src/model/model.hpp"

namespace sb {

struct MemoryPlanRow {
  std::string run;                  // "full, train.zero = 0", "LoRA r 16, train.zero = 1", ...
  double base = 0;                  // bytes: the frozen base (LoRA)
  double weights = 0, grads = 0;    // bytes: the trainable weights (and their device copies), gradients
  double optimizer = 0;             // bytes: AdamW moments (+ ZeRO's master and reduced-gradient slices)
  double activations = -1;          // bytes of one micro-batch's forward/backward; < 0: not modelled
  double total() const { return base + weights + grads + optimizer + (activations > 0 ? activations : 0); }
};

// The four rows (full and LoRA, ZeRO-1 off and on) of model `d` for `ranks` data-parallel ranks on
// e.device (e.exec: the LM-head chunk, recomputation; e.zero is not read, both are planned). LoRA:
// `lora` ([lora]), or rank 16, alpha 32 on every target when lora.rank = 0. The parameter state
// follows the engines' own accounting (the start-of-run memory lines); the CPU activations are the
// CPU model's buffers for one micro-batch of micro_batch_tokens (train.micro_batch_tokens); the
// GPU's activations are not modelled.
std::vector<MemoryPlanRow> memory_plan(const ModelDims& d, const LoraSpec& lora, const EngineSettings& e,
                                       int64_t micro_batch_tokens, int ranks);

}  // namespace sb
