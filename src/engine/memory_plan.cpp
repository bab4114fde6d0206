#include "src/engine/memory_plan.hpp"

#include <algorithm>

#include "src/comm/comm.hpp"
#include "src/model/gpu_buffers.hpp"

namespace sb {

// The CPU model's buffers for one micro-batch of N tokens (model.cpp, Model<T>::Layer and run()),
// float32: every layer's saved activations (only its input under train.recompute, then one layer's
// in full), the backward's work buffers, and one chunk of the LM head's logits.
static double cpu_activations(const ModelDims& d, const ModelExec& e, int64_t N, const LoraSpec& lora) {
  const double C = d.d_model, F = d.ffn_dim, H = d.n_heads, HD = double(d.n_heads) * d.head_dim,
               KD = double(d.n_kv_heads) * d.head_dim;
  double per_layer = 4 * C + 2 + 2 * HD + 2 * KD + H + 3 * F;                  // x_in xn x_mid xn2, rstd, q att, k v, lse, gate up h
  if (d.qk_norm) per_layer += HD + KD + H + d.n_kv_heads;                     // q_raw k_raw rstdq rstdk
  if (lora.on())
    for (int t = 0; t < kLoraTargets; ++t) per_layer += lora.targets[size_t(t)] ? lora.rank : 0;  // u
  const double layers = e.recompute ? double(d.n_layers) * C + per_layer : double(d.n_layers) * per_layer;
  const double work = 3 * F + 2 * C + 2 * HD + 2 * KD + 5 * C + 2;            // dh dg du, dxn tmp, datt dq, dk dv, x dx xf dxf
  const double head = double(e.head_rows(int(N), int(d.vocab))) * double(d.vocab);
  return double(N) * (layers + work) * 4 + head * 4;
}

// The GPU model's buffers for one micro-batch of N tokens: gpu_buffers() is what ModelCuda sizes them
// by (src/model/gpu_buffers.hpp: every layer's saved activations, or under train.recompute = layer
// only each layer's fp32 input beside one work layer; the packed projections' outputs, the final
// norm, one LM-head chunk of bf16 logits, the backward's gradients of every tensor once, the
// attention backward's fp32 workspace, LoRA's (N, rank) u of each adapter, its backward scratch and
// dropout's copies, the packed q|k|v weights where biases sit between them), plus the attention's
// block lists (gpu_selection_bytes: one N-token document).
static double cuda_activations(const ModelDims& d, const ModelExec& e, const AttnSettings& a, int k_max, int64_t N,
                               const LoraSpec& lora, bool qkv_adjacent) {
  return gpu_buffers(d, e, lora, N, qkv_adjacent).bytes() + gpu_selection_bytes(d, a, k_max, N);
}

std::vector<MemoryPlanRow> memory_plan(const ModelDims& d, const LoraSpec& lora_in, const EngineSettings& e,
                                       const AttnSettings& attn, int k_max, int64_t micro_batch_tokens, int ranks) {
  const ParamLayout base(d);
  LoraSpec lora = lora_in;
  if (!lora.on()) lora.rank = 16, lora.alpha = 32;
  const double P = double(base.size), T = double(lora_layout(base, d, lora).train.size);
  const bool cuda = e.device == "cuda";
  std::vector<MemoryPlanRow> rows;
  for (bool is_lora : {false, true})
    for (bool zero : {false, true}) {
      MemoryPlanRow r;
      r.run = (is_lora ? "LoRA r " + std::to_string(lora.rank) : std::string("full")) + ", train.zero = " + (zero ? "1" : "0");
      const double n = is_lora ? T : P;
      const double k = zero ? double(slice_of(size_t(n), 0, ranks).size()) : n;  // rank 0's slice: the largest
      if (!cuda) {  // update.cpp memory_line: fp32 weights and gradients, moments of the slice (+ its reduced gradient)
        r.base = is_lora ? 4 * P : 0;
        r.weights = 4 * n, r.grads = 4 * n;
        r.optimizer = 8 * k + (zero ? 4 * k : 0);
        r.activations = cpu_activations(d, e.exec, micro_batch_tokens, is_lora ? lora : LoraSpec{});
      } else {  // engine_cuda.cpp memory_line: bf16 weights, fp32 gradients, fp32 master or (ZeRO) its slice
        // (model_cuda.cpp's constructor): the trainable tensors' buffers, LoRA's frozen base apart,
        // each frozen tensor once, bf16, or fp32 where read in fp32 (norms, biases; not the embedding)
        const LoraLayout ll = lora_layout(base, d, is_lora ? lora : LoraSpec{});
        const GpuFrozenCopies frozen = gpu_frozen_copies(base, ll.of_base);
        r.base = 2 * double(frozen.n16) + 4 * double(frozen.n32);
        double train32 = 0;  // with ZeRO the model keeps fp32 copies of what it reads in fp32 only
        for (size_t i : fp32_read_params(base)) train32 += ll.of_base[i] != kNoParam ? double(base.params[i].size) : 0;
        r.weights = 2 * n + 4 * (zero ? train32 : n);
        r.grads = 4 * n;
        r.optimizer = 8 * k + (zero ? 4 * k + (ranks > 1 ? 4 * k : 0) : 0);
        r.activations = cuda_activations(d, e.exec, attn, k_max, micro_batch_tokens, is_lora ? lora : LoraSpec{},
                                         gpu_qkv_adjacent(base, ll.train, ll.of_base, frozen));
        r.runtime = kCudaRuntimeBytes;
      }
      rows.push_back(r);
    }
  return rows;
}

}  // namespace sb
