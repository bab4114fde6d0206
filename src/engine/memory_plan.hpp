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
  double activations = -1;          // bytes of one micro-batch's forward/backward buffers; < 0: not modelled
  double runtime = 0;               // bytes: the GPU's CUDA context, cuBLAS and NCCL (kCudaRuntimeBytes); 0 on the CPU
  double total() const { return base + weights + grads + optimizer + (activations > 0 ? activations : 0) + runtime; }
};

// What a CUDA process holds on its GPU beside its own buffers: the context (the runtime, the loaded
// kernels of ours, cuBLAS and NCCL), cuBLAS's workspace, NCCL's communicator, the allocator's
// rounding. Nothing the program allocates counts it, but the measured peak does (cudaMemGetInfo's
// total - free, the whole device: ModelCuda::peak_memory_bytes), so the plan adds it: 1.2 GiB, what
// three recorded full fine-tuning runs held beyond the buffers this plan counts (1,206-1,226 MiB:
// the 0.47B model at 64K with recomputation on an H100, bench/results/2026-12-06-compacted-grid-checks.md;
// the Qwen2.5-0.5B shape at 64K on an H200, 2026-12-04-piece-major-mha.md, and at 16K,
// 2026-12-03-packed-projections.md). An estimate for CUDA 12 on an H100 / H200, not a measurement
// of the machine at hand.
constexpr double kCudaRuntimeBytes = 1.2 * (1 << 30);

// The four rows (full and LoRA, ZeRO-1 off and on) of model `d` for `ranks` data-parallel ranks on
// e.device (e.exec: the LM-head chunk, recomputation; e.zero is not read, both are planned). LoRA:
// `lora` ([lora]), or rank 16, alpha 32 on every target when lora.rank = 0. The parameter state
// follows the engines' own accounting (the start-of-run memory lines). Activations, one micro-batch
// of micro_batch_tokens (train.micro_batch_tokens): on the CPU the CPU model's buffers (fp32); on
// the GPU the buffers ModelCuda sizes through gpu_buffers() (src/model/gpu_buffers.hpp) and the
// attention's block lists of one document that long (attn: sparse or dense, block, local blocks,
// gate modes, dense layers; k_max the largest budget a layer may get), plus kCudaRuntimeBytes.
std::vector<MemoryPlanRow> memory_plan(const ModelDims& d, const LoraSpec& lora, const EngineSettings& e,
                                       const AttnSettings& attn, int k_max, int64_t micro_batch_tokens, int ranks);

}  // namespace sb
