// The GPU model's device buffers (ModelCuda: model_cuda.cpp, lora_cuda.cpp), sized in one place:
// ModelCuda sizes its buffers from gpu_buffers() and `sparsebalance memory` plans with the same
// function (src/engine/memory_plan.cpp), so the plan counts what the model allocates. Plain C++ (no
// CUDA): built and tested on every machine (tests/train/test_lora.cpp, Lora.MemoryPlan*).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"
#include "src/model/model.hpp"

namespace sb {

// Where the GPU model keeps a frozen tensor (LoRA; ModelCuda's constructor): once, in base16_ (bf16:
// what the GEMMs and the embedding read) or base32_ (fp32: the norms and biases read in fp32).
struct GpuFrozenCopies {
  std::vector<size_t> off16, off32;  // (base tensors) offset in base16_ / base32_, else kNoParam
  size_t n16 = 0, n32 = 0;           // elements of base16_, base32_
};
// of_base: (base tensors) index in the trainable layout, kNoParam when frozen (LoraLayout::of_base).
GpuFrozenCopies gpu_frozen_copies(const ParamLayout& base, const std::vector<size_t>& of_base);
// Every layer's q, k, v weights back to back in the bf16 copy the GEMMs read (the trainable w16_
// or the frozen base16_), so q|k|v is one (H*D + 2*Hkv*D, C) matrix in place; else (Qwen2's biases
// between them, full fine-tuning) ModelCuda gathers a packed copy every run.
bool gpu_qkv_adjacent(const ParamLayout& base, const ParamLayout& train, const std::vector<size_t>& of_base,
                      const GpuFrozenCopies& frozen);

// One layer's saved activations (ModelCuda::Layer), elements, for N tokens.
struct GpuLayerBuffers {
  size_t x_in = 0, rstd1 = 0;          // fp32 (N, C) the layer's input, (N)
  size_t xn = 0, q = 0, k = 0, v = 0;  // bf16 (N, C), (N, H*D), (N, Hkv*D), (N, Hkv*D) after RoPE
  size_t q_raw = 0, k_raw = 0;         // bf16 qk_norm: q, k before their norms (N, H*D), (N, Hkv*D)
  size_t rstdq = 0, rstdk = 0;         // fp32 qk_norm: (N*H), (N*Hkv)
  size_t att = 0;                      // bf16 (N, H*D)
  size_t lse = 0;                      // fp32 (N, H)
  size_t x_mid = 0, rstd2 = 0;         // fp32 (N, C) after the attention residual, (N)
  size_t xn2 = 0, h = 0, gu = 0;       // bf16 (N, C), (N, F) swiglu, (N, 2F) gate|up
  size_t u = 0;                        // bf16 (N, rank): u[t] of each of the layer's `adapters`
  int adapters = 0;                    // LoRA targets with an adapter in the layer
  double bytes_but_input() const;      // every buffer but x_in
};

// Every buffer ModelCuda::run sizes for a micro-batch of N tokens (training: the backward's too),
// elements unless named bytes. The parameter copies (weights, gradients, master, base) are not here:
// the engine's memory line counts them.
struct GpuBuffers {
  GpuLayerBuffers layer;
  int n_layers = 0;
  // train.recompute = layer: layers_[l] keep x_in (and the selection) only, one work_ layer the rest;
  // else every layers_[l] holds every buffer (work_ stays empty)
  bool recompute = false;
  size_t tokens = 0;            // int32 (N) each of tokens_, targets_, pos_, argmax_
  size_t loss = 0, rstdf = 0;   // fp32 (N)
  size_t qkv = 0;               // bf16 (N, H*D + 2*Hkv*D) the packed projection's output
  size_t xs_top = 0;            // fp32 (N, C) the last layer's output
  size_t xf = 0;                // bf16 (N, C) after the final norm
  int head_rows = 0;            // tokens per LM-head chunk (ModelExec::head_rows, bf16 logits)
  size_t head = 0;              // bf16 (head_rows, V) logits, then dlogits over them
  size_t dxf = 0, dx = 0, dxn = 0;  // fp32 (N, C)
  size_t dx16 = 0;              // bf16 (N, C)
  size_t dh = 0, dgu = 0;       // bf16 (N, F), (N, 2F)
  size_t dqkv = 0;              // bf16 (N, H*D + 2*Hkv*D)
  size_t datt = 0, dq = 0;      // bf16 (N, H*D)
  size_t dk = 0, dv = 0;        // bf16 (N, Hkv*D)
  size_t attn_ws = 0;           // bytes: the attention backward's workspace (kernels::attention_bwd_workspace_bytes)
  size_t du = 0;                // bf16 (N, rank) LoRA: an adapter's backward scratch
  size_t xd = 0, dxa = 0;       // lora.dropout > 0: bf16 / fp32 (N, in) of the widest adapted input
  size_t qkv_weights = 0;       // bf16 (L, H*D + 2*Hkv*D, C) the packed q|k|v copy, when not adjacent
  double layers_bytes() const;  // the layers' activations (L inputs, then every layer's or the work layer's rest)
  double bytes() const;         // everything above
};

// The sizes for N tokens of model `d` run as `e` (head chunk, recomputation) with `lora` (its
// targets, rank, dropout); qkv_adjacent as gpu_qkv_adjacent.
GpuBuffers gpu_buffers(const ModelDims& d, const ModelExec& e, const LoraSpec& lora, int64_t N, bool qkv_adjacent);

// Bytes of the attention's block lists for one micro-batch of one N-token document (the worst
// case: the most causal blocks), mirrored from kernels/cuda (not sized through here): sparse, every
// sparse layer's DeviceSelection reserved by DeviceGating (rows x (k_max + local + 2) kept blocks,
// the transpose, both launch orders, the backward's compacted-grid list) and DeviceGating's own
// buffers (pooled q and k, slots, bit matrix, sort keys); dense (and the dense layers of a sparse
// run), one all-causal selection. a: sparse, block_size, local_blocks, the gate modes, dense;
// k_max the largest budget a layer may get.
double gpu_selection_bytes(const ModelDims& d, const AttnSettings& a, int k_max, int64_t N);

}  // namespace sb
