#include "src/config/schema.hpp"

namespace sb {

std::vector<KeySpec> schema_model_train() {
  using T = KeyType;
  constexpr double BIG = kNoUpperBound;
  return {
      // [model] Llama-style decoder; shapes follow Hugging Face names.
      {"model.n_layers", T::Int, "2", 1, 1024, {}, "transformer layers"},
      {"model.d_model", T::Int, "64", 8, 65536, {}, "hidden size C"},
      {"model.n_heads", T::Int, "4", 1, 1024, {}, "query heads H (d_model must divide by it)"},
      {"model.n_kv_heads", T::Int, "2", 1, 1024, {}, "key/value heads (must divide n_heads; GQA)"},
      {"model.ffn_dim", T::Int, "192", 1, 1 << 20, {}, "SwiGLU hidden size"},
      {"model.vocab_size", T::Int, "0", 0, 1 << 24, {}, "vocabulary; 0 = take the data's vocab_size"},
      {"model.rope_theta", T::Float, "10000", 1, 1e12, {}, "RoPE base (rotate-half convention)"},
      {"model.norm_eps", T::Float, "1e-5", 1e-12, 1, {}, "RMSNorm epsilon"},
      {"model.tie_embeddings", T::Bool, "true", 0, 0, {}, "LM head shares the embedding matrix"},
      {"model.qkv_bias", T::Bool, "false", 0, 0, {}, "q/k/v projections carry biases (Qwen2); convert and --init-from set it from the HF config"},
      {"model.max_position_embeddings", T::Int, "4096", 1, 1 << 30, {}, "context the weights are meant for: written to an exported HF config.json (convert), not enforced"},
      {"model.head_dim", T::Int, "0", 0, 65536, {}, "size of one attention head D (even); 0 = d_model / n_heads. Qwen3 decouples it (0.6B: 128 with d_model 1024 and 16 heads); convert and --init-from set it from the HF config"},
      {"model.qk_norm", T::Bool, "false", 0, 0, {}, "RMSNorm over each head's q and k (weights of head_dim) before RoPE (Qwen3); convert and --init-from set it from the HF config"},
      {"model.rope_scaling.type", T::String, "none", 0, 0, {"none", "linear", "llama3", "yarn"}, "RoPE scaling (src/model/README.md, 'RoPE scaling'): none = plain RoPE; linear = positions / factor; llama3 = Llama 3.1's per-frequency blend (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings); yarn = YaRN's frequency ramp and attention factor (factor, original_max_position_embeddings, beta_fast, beta_slow, attention_factor). convert / --init-from read it from config.json; set it for a run to extend a model's context"},
      {"model.rope_scaling.factor", T::Float, "1", 1, 1e6, {}, "linear, llama3, yarn: how many times the original context the positions stretch over"},
      {"model.rope_scaling.original_max_position_embeddings", T::Int, "0", 0, 1 << 30, {}, "llama3, yarn: the context the model was pre-trained at (required for them)"},
      {"model.rope_scaling.low_freq_factor", T::Float, "1", 1e-9, 1e9, {}, "llama3: wavelengths over original / low_freq_factor are divided by factor"},
      {"model.rope_scaling.high_freq_factor", T::Float, "4", 1e-9, 1e9, {}, "llama3: wavelengths under original / high_freq_factor are kept; those between blend"},
      {"model.rope_scaling.beta_fast", T::Float, "32", 1e-9, 1e9, {}, "yarn: dimensions turning more than beta_fast times over the original context are kept"},
      {"model.rope_scaling.beta_slow", T::Float, "1", 1e-9, 1e9, {}, "yarn: dimensions turning fewer than beta_slow times are divided by factor; a linear ramp between"},
      {"model.rope_scaling.attention_factor", T::Float, "0", 0, 1e9, {}, "yarn: cos and sin are multiplied by it (q.k by its square); 0 = transformers' default 0.1 ln(factor) + 1"},
      {"model.rope_scaling.truncate", T::Bool, "true", 0, 0, {}, "yarn: the ramp's bounds rounded to whole dimensions (transformers' default)"},
      {"model.rope_scaling.field", T::String, "rope_scaling", 0, 0, {"rope_scaling", "rope_parameters"}, "the config.json field an exported model writes the scaling under: rope_scaling (transformers 4) or rope_parameters (transformers 5); convert keeps the input's"},
      {"model.init_std", T::Float, "0.02", 1e-6, 1, {}, "normal init std (output projections / sqrt(2L))"},
      {"model.lm_head_chunk", T::Int, "0", 0, 1 << 30, {}, "tokens per chunk of the fused LM head + cross-entropy: the (tokens x vocab) logits are never whole in memory (0 = auto: the most tokens whose logits fit in 1 GiB, fp32 on the CPU and bf16 on the GPU, a multiple of 128; all tokens at once when they fit)"},
      // [train]
      {"train.steps", T::Int, "40", 0, BIG, {}, "optimizer steps to run (total, across resumes)"},
      {"train.global_batch_tokens", T::Int, "8192", 1, BIG, {}, "tokens per step over all ranks (whole documents are drawn until this is reached)"},
      {"train.micro_batch_tokens", T::Int, "2048", 16, BIG, {}, "token capacity of one micro-batch (memory); longer documents are windowed, rejected or split over ranks (data.long_docs)"},
      {"train.lr", T::Float, "3e-3", 1e-12, 10, {}, "peak learning rate"},
      {"train.min_lr_ratio", T::Float, "0.1", 0, 1, {}, "cosine schedule floor as a fraction of lr"},
      {"train.warmup_steps", T::Int, "4", 0, BIG, {}, "linear warmup steps"},
      {"train.decay_steps", T::Int, "0", 0, BIG, {}, "step at which the cosine reaches lr * min_lr_ratio, held after it (0 = train.steps): a short run follows the first steps of a longer run's schedule"},
      {"train.weight_decay", T::Float, "0.1", 0, 10, {}, "AdamW decoupled weight decay (not on norms)"},
      {"train.beta1", T::Float, "0.9", 0, 0.999999, {}, "AdamW beta1"},
      {"train.beta2", T::Float, "0.95", 0, 0.999999, {}, "AdamW beta2"},
      {"train.adam_eps", T::Float, "1e-8", 1e-30, 1, {}, "AdamW epsilon"},
      {"train.grad_clip", T::Float, "1.0", 0, 1e9, {}, "clip the global gradient norm to this (0 = off)"},
      {"train.seed", T::Int, "42", 0, BIG, {}, "seed of parameter init and of every random choice in training"},
      {"train.device", T::String, "cpu", 0, 0, {"cpu", "cuda"}, "where the model runs"},
      {"train.peak_tflops", T::Float, "0", 0, 1e9, {}, "peak TFLOP/s of one rank's device for mfu (0 = the device's: 989 on cuda (H200 dense bf16), mfu not reported on cpu)"},
      {"train.recompute", T::String, "none", 0, 0, {"none", "layer"}, "activation recomputation: layer = keep only each decoder layer's input (and block selection) in the forward and recompute the layer in its backward (less memory, about one more forward)"},
      {"train.threads", T::Int, "1", 0, 1024, {}, "BLAS threads per rank (0 = library default)"},
      {"train.bucket_mb", T::Float, "4", 0.001, 4096, {}, "gradient all-reduce bucket size in MiB"},
      {"train.zero", T::Int, "0", 0, 1, {}, "ZeRO-1: 1 slices the AdamW moments over the ranks (gradients reduced to each slice's owner, weights all-gathered; checkpoints written collectively); on cuda the fp32 master weights too (NCCL, or MPI through the host when ranks share a GPU)"},
      {"train.overlap_reduce", T::Bool, "true", 0, 0, {}, "cuda, NCCL: reduce each layer's gradients during the step's last backward pass (all-reduced; train.zero = 1: to each slice's owner)"},
      {"train.phase_times", T::Bool, "false", 0, 0, {}, "cuda: print on rank 0 each step's GPU ms per phase (attention forward and backward, GEMMs, gating, elementwise, LM head + loss, optimizer, all-reduce; CUDA events) and the idle rest of its wall time"},
      {"train.nonfinite", T::String, "skip", 0, 0, {"skip", "stop"}, "on NaN/inf loss or gradient: skip the step or stop"},
      {"train.sync_check_every", T::Int, "10", 0, BIG, {}, "every N steps verify that all ranks hold bit-identical parameters (0 = never)"},
      {"train.max_skips", T::Int, "5", 0, BIG, {}, "consecutive skipped steps before stopping"},
      {"train.inject_nan_step", T::Int, "0", 0, BIG, {}, "testing aid: poison the loss and a gradient with NaN/inf at this step (0 = off)"},
      {"train.inject_nan_count", T::Int, "1", 1, BIG, {}, "testing aid: number of consecutive poisoned steps from train.inject_nan_step"},
      {"train.inject_error_rank", T::Int, "0", 0, 1 << 20, {}, "testing aid: the rank that throws at train.inject_error_step"},
      {"train.inject_error_step", T::Int, "0", 0, BIG, {}, "testing aid: throw an error at this step (0 = off) on train.inject_error_rank, at the start of train.inject_error_phase"},
      {"train.inject_error_phase", T::String, "compute", 0, 0, {"plan", "predict", "exchange", "tune", "compute", "reduce", "update", "measure", "record", "checkpoint"}, "testing aid: the phase of the step that throws (checkpoint: in the checkpoint write)"},
      // [lora] low-rank adapters on a frozen base (README.md "LoRA", src/model/README.md "LoRA")
      {"lora.rank", T::Int, "0", 0, 65536, {}, "LoRA rank r: 0 = off (full fine-tuning); > 0 freezes the base (no gradient, master copy or moments) and trains adapters A (r, in), B (out, r) on each of lora.targets, plus lora.train_also"},
      {"lora.alpha", T::Float, "16", 1e-9, 1e9, {}, "LoRA alpha: an adapter adds (alpha / rank) B (A x) to its projection (PEFT's lora_alpha)"},
      {"lora.dropout", T::Float, "0", 0, 1, {}, "dropout probability on the adapters' input x in training (PEFT's lora_dropout), below 1; the same elements dropped on the CPU and the GPU (a hash of seed, step, rank, micro-batch, layer, target, element); 0: none"},
      {"lora.targets", T::String, "q,k,v,o,gate,up,down", 0, 0, {}, "the projections that get adapters: comma-separated, any of q, k, v, o, gate, up, down (PEFT's target_modules q_proj .. down_proj)"},
      {"lora.train_also", T::String, "", 0, 0, {}, "parts trained in full beside the adapters (LongLoRA's LoRA+): comma-separated, any of embed, norm (every RMSNorm), head (the LM head; with tied embeddings the same tensor as embed); empty: none"},
      // [attention]
      {"attention.mode", T::String, "sparse", 0, 0, {"dense", "sparse"}, "dense or block-sparse attention"},
      {"attention.block_size", T::Int, "32", 4, 4096, {}, "block size Bs in tokens: the gating's unit (on an H200, dense CUDA attention tiles at 128 whatever it is)"},
      {"attention.k", T::Int, "4", 0, 1 << 20, {}, "default budget k0: blocks per query row besides the anchors"},
      {"attention.local_blocks", T::Int, "1", 0, 1 << 20, {}, "w local blocks before the diagonal, always kept"},
      {"attention.theta", T::Float, "8", 0, 1e30, {}, "threshold: drop blocks scoring below anchor - theta"},
      {"attention.gate_query", T::String, "mean", 0, 0, {"mean", "max"}, "how the gate scores a key block for a query block: mean, the query block's mean vector; max, the best of its tokens' vectors (MoBA-style per-token scoring; kernels/README.md, 'Gate modes'). Default provisional: alone, max read 6.9% of retrieval against mean's 37.9%; with gate_key = bounds 98.9% (bench/results/2026-12-07-gate-reads-gpu.md)"},
      {"attention.gate_key", T::String, "mean", 0, 0, {"mean", "bounds", "sub"}, "the key block's summary the gate scores: mean, its mean key; bounds, per-dimension max and min (Quest: an upper bound on q.k in the block); sub, attention.gate_sub_blocks sub-block means, the best of them. Default provisional: bounds read 96.0% of retrieval against mean's 37.9% on the recipe's model, at a higher whole-document loss (6.37 against 5.79); the sparse fine-tunes decide"},
      {"attention.gate_sub_blocks", T::Int, "4", 1, 4096, {}, "attention.gate_key = \"sub\": sub-blocks per key block (must divide attention.block_size)"},
      {"attention.dense_layers", T::String, "", 0, 0, {}, "layers that attend densely in a sparse run (hybrid layers; every causal block kept, no gating): comma-separated layer indices and/or last:N, e.g. \"last:3\" or \"0,5,last:2\"; empty: none"},
      {"attention.part_exchange", T::String, "auto", 0, 0, {"auto", "allgather", "selective"}, "how a split document's K/V reach its group (data.long_docs = \"split\", CPU): all-gather of the whole document, only the blocks each rank's rows keep (pooled keys shared for gating), or auto: selective when it moves below half the all-gather's rows (src/model/README.md, 'Documents in parts'); the CUDA path always all-gathers", "attention.shard_exchange"},
      // [checkpoint]
      {"checkpoint.dir", T::String, "runs/tiny/ckpt", 0, 0, {}, "directory of checkpoints (ckpt_<step>.h5)"},
      {"checkpoint.every", T::Int, "10", 0, BIG, {}, "steps between checkpoints (0 = only the final one)"},
      {"checkpoint.keep", T::Int, "3", 1, 1 << 20, {}, "newest checkpoints kept"},
      {"checkpoint.on_error", T::String, "stop", 0, 0, {"stop", "continue"}, "when a checkpoint cannot be written"},
      // [log]
      {"log.path", T::String, "runs/tiny/metrics.h5", 0, 0, {}, "HDF5 metrics log"},
      {"log.every", T::Int, "2", 1, BIG, {}, "steps between log flushes"},
      {"log.progress", T::Bool, "true", 0, 0, {}, "print a progress line per step on rank 0"},
      {"log.batches", T::String, "", 0, 0, {}, "write every step's documents (tokens, targets) to this JSON-lines file (rank 0; for bench/torch/torch_trajectory.py); empty = off"},
      // [eval]
      {"eval.docs", T::Int, "32", 1, BIG, {}, "validation documents evaluated"},
      {"eval.buckets", T::String, "256,1024,4096", 0, 0, {}, "upper bounds of document-length buckets for the loss report"},
      {"eval.diagnose_rows", T::Int, "16", 0, 1 << 20, {}, "eval --diagnose: sampled query-block rows per layer and document whose true recall is measured beside the gate's estimate"},
  };
}

}  // namespace sb
