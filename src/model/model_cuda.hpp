// The model on one GPU, mixed precision: the same network, parameter layout and semantics as
// Model<float> (model.hpp), with fp32 master weights, gradients and residual stream, bf16 weight
// copy, activations and attention, every GEMM through cuBLAS with fp32 accumulation.
// Reads top to bottom in model_cuda.cpp, as model.cpp does. Plain C++ (CUDA runtime API only).
// LoRA ([lora], model.hpp "LoRA"): the frozen base lives once on the device, in bf16 (the norms and
// biases it reads in fp32: fp32), with no master, gradient or moments; the trainable tensors (the
// adapters and train_also parts, Model::layout()) are what the master, the gradients and the
// engine's AdamW cover (src/model/lora_cuda.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "src/model/gpu_buffers.hpp"
#include "src/model/model.hpp"
#include "src/model/phase_clock_cuda.hpp"

namespace sb {

// A device allocation that only grows (activations are re-sized per micro-batch). Not copyable.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) { resize(n); }
  ~DeviceArray();
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), cap_(o.cap_) { o.p_ = nullptr, o.cap_ = 0; }
  // Ensures room for n elements; contents are not kept when it grows.
  T* resize(size_t n);
  T* data() const { return p_; }
  size_t capacity() const { return cap_; }

 private:
  T* p_ = nullptr;
  size_t cap_ = 0;
};

// The exchange of a split document's rows on device buffers (bf16), passed in by the trainer
// (src/parts/groups_cuda.hpp: NCCL with one GPU per rank, MPI through host memory when ranks share a
// GPU): the model never communicates. Collective over the part's group, called in the same order
// on every member (layer by layer, the parts in batch order); the work is enqueued on `stream` and
// may still be running when the call returns.
struct PartExchangeCuda {
  using bf16 = kernels::cuda::bf16;
  // This rank's rows (local_tokens() x width) -> the whole document's (doc_len x width), in
  // document order, from every member.
  std::function<void(const DocPart&, const bf16* mine, bf16* whole, int width, cudaStream_t)> gather;
  // The sum over the group of every member's whole-document rows (doc_len x width) -> the rows this
  // rank owns (local_tokens() x width, packed order): summed in fp32 in member order, rounded to
  // bf16 once (as the float sum of the bf16 contributions on the host would be).
  std::function<void(const DocPart&, const bf16* whole, bf16* mine, int width, cudaStream_t)> reduce_scatter;
};

// Scratch of a split document's attention on the GPU (part_attention_cuda.cpp): the whole
// document's rows on the device, grown as needed.
struct PartScratchCuda {
  DeviceArray<kernels::cuda::bf16> q, o, dout, dq;  // (doc_len, H*D)
  DeviceArray<kernels::cuda::bf16> k, v, dk, dv;    // (doc_len, Hkv*D)
  DeviceArray<float> lse;                           // (doc_len, H)
  DeviceArray<unsigned char> ws;                    // the backward's workspace
};

// part_attention_fwd/bwd (model.hpp) on device buffers, with the same arguments (q, att, dq at the
// part's first packed row, and so on) and the trainer's device exchange.
// The forward builds `sel` (on the host, uploaded) when `gate`, else reuses it (recomputation).
kernels::GatingStats part_attention_fwd_cuda(const DocPart& sh, const PartExchangeCuda& ex,
                                              const kernels::cuda::bf16* q, const kernels::cuda::bf16* k,
                                              const kernels::cuda::bf16* v, kernels::AttnShape s, bool sparse,
                                              kernels::GatingParams p, bool gate, kernels::cuda::DeviceSelection& sel,
                                              kernels::cuda::bf16* att, float* lse, PartScratchCuda& h,
                                              cudaStream_t stream);
void part_attention_bwd_cuda(const DocPart& sh, const PartExchangeCuda& ex, const kernels::cuda::bf16* q,
                              const kernels::cuda::bf16* k, const kernels::cuda::bf16* v,
                              const kernels::cuda::bf16* att, const float* lse, const kernels::cuda::bf16* datt,
                              kernels::AttnShape s, const kernels::cuda::DeviceSelection& sel, kernels::cuda::bf16* dq,
                              kernels::cuda::bf16* dk, kernels::cuda::bf16* dv, PartScratchCuda& h,
                              cudaStream_t stream);

class ModelCuda {
 public:
  using bf16 = kernels::cuda::bf16;
  // Same dims and parameter layout as the host model (Model::layout()); allocates weights and
  // gradients on the current device. Without fp32_master (train.zero = 1: the engine keeps the fp32
  // master weights of its slice) the model keeps fp32 copies only of the tensors it reads in fp32
  // (embedding, norms, q/k/v biases) beside the bf16 copy of every weight.
  ModelCuda(const ModelDims& dims, const ParamLayout& layout, bool fp32_master = true)
      : ModelCuda(dims, layout, LoraSpec{}, fp32_master) {}
  // LoRA (lora.on()): `base` is the model's own layout (Model::base_layout()); the trainable one
  // (weights(), grads(), size(), upload_weights, set_weights) is lora_layout(base, dims, lora), as
  // Model::layout(). Off: the same as the constructor above.
  ModelCuda(const ModelDims& dims, const ParamLayout& base, const LoraSpec& lora, bool fp32_master = true);
  ~ModelCuda();
  ModelCuda(const ModelCuda&) = delete;
  ModelCuda& operator=(const ModelCuda&) = delete;

  // fp32 weights (flat, params order) to the device (also refreshes the bf16 copy), and back.
  void upload_weights(const std::vector<float>& w);
  void download_weights(std::vector<float>& w) const;  // with the fp32 master only
  // The fp32 values of the flat range [lo, lo + len) (device, read in order on stream()): the bf16
  // copy and the fp32 copies of that range. The ZeRO all-gather delivers the updated weights here.
  void set_weights(const float* piece, size_t lo, size_t len);
  bool has_master() const { return master_; }
  // LoRA: the frozen base (Model::base(), base_layout() order, fp32) to its device copies (lora_cuda.cpp).
  void upload_base(const std::vector<float>& base);
  // fnv1a_words of the frozen base's device copies (their bits as floats; 0 without LoRA): it never changes.
  uint64_t base_hash() const;
  double base_bytes() const { return double(base16_.capacity()) * 2 + double(base32_.capacity()) * 4; }
  size_t fp32_copy_size() const { return w32_size_; }  // fp32 values held: n with the master

  // As Model::forward_backward: gradients accumulate into grads(), scaled by loss_scale; attention
  // and gating times are GPU times (CUDA events), total_ms the wall time to a synchronised end.
  // layer_done (optional) is called with l once the backward of layer l is enqueued on stream():
  // its gradients (layer_range(l)) are complete when the stream gets there.
  // A batch with parts (data.long_docs = "split") needs `ex`, collective over each part's group
  // (as Model::forward_backward, on device buffers: PartExchangeCuda).
  MicroBatchStats forward_backward(const PackedBatch& b, const AttnSettings& a, float loss_scale,
                                   const std::function<void(int)>& layer_done = {},
                                   const PartExchangeCuda* ex = nullptr) {
    return run(b, a, loss_scale, true, nullptr, layer_done, ex);
  }
  // As Model::forward (evaluation): loss and, when asked, the greedy prediction of every token; no
  // gradients (grads() untouched).
  MicroBatchStats forward(const PackedBatch& b, const AttnSettings& a, std::vector<int32_t>* argmax = nullptr) {
    return run(b, a, 0.f, false, argmax);
  }

  float* weights() { return master_ ? w32_.data() : nullptr; }  // the fp32 master (params order)
  bf16* weights16() { return w16_.data(); }
  float* grads() { return g32_.data(); }
  // The flat range [begin, end) of layer l's parameters (ParamLayout::layer_range).
  // LoRA: the trainable layout has no layer ranges (lora_layout), so this throws; the engine reduces at once.
  std::pair<size_t, size_t> layer_range(int l) const { return layout_.layer_range(l); }
  size_t size() const { return n_; }
  void zero_grads();
  // Memory-for-time choices (ModelExec, model.hpp): the LM head's chunk, layer recomputation.
  const ModelExec& exec() const { return exec_; }
  void set_exec(const ModelExec& e) { exec_ = e; }
  // The diagnostics' probe (model.hpp): while set, sparse layers gate on the host and the probe
  // gets float copies of q and k and the host selection before its upload.
  void set_probe(SelectionProbe p) { probe_ = std::move(p); }
  // lora.dropout > 0: the next forward_backward's draw, as Model::set_dropout_key (the same elements dropped).
  void set_dropout_key(uint64_t k) { drop_key_ = k; }
  cudaStream_t stream() const { return stream_; }
  // Per-phase GPU times (train.phase_times): run() marks its phases and collects them at its end;
  // the engine adds the optimizer and all-reduce and reads the totals.
  PhaseClock& phases() { return phases_; }
  // High-water mark of the device memory in use (bytes: total - free of cudaMemGetInfo, so the
  // whole device, read after every micro-batch). Our buffers only grow and the stream-ordered pool
  // keeps what it freed, so the value after a micro-batch is its peak.
  double peak_memory_bytes() const { return double(mem_peak_); }
  // Bytes of the activation and work buffers held now (every DeviceArray run() sizes through
  // gpu_buffers(), the largest micro-batch's so far; not the block selections): what the memory
  // plan's GPU activations count (src/engine/memory_plan.cpp).
  double buffer_bytes() const;

 private:
  struct Layer;
  struct Timers;
  MicroBatchStats run(const PackedBatch& b, const AttnSettings& a, float loss_scale, bool backward,
                      std::vector<int32_t>* argmax, const std::function<void(int)>& layer_done = {},
                      const PartExchangeCuda* ex = nullptr);
  void layer_forward(int l, const PackedBatch& b, const AttnSettings& a, Layer& A, float* x_out, bool gate,
                     MicroBatchStats& st, Timers& timers, Timers& gtimers);
  // The shape of the whole sequences' attention: dense tiles at kc::dense_block_size (every causal
  // block is kept whatever the block), sparse at the gating's block. Split parts keep the gating's.
  kernels::AttnShape attn_shape(const AttnSettings& a) const;
  // The rows of b.parts (after the whole sequences) through part_attention_*_cuda.
  void parts_forward(int l, const PackedBatch& b, const AttnSettings& a, Layer& A, bool gate);
  void parts_backward(int l, const PackedBatch& b, const AttnSettings& a, const Layer& A, const bf16* datt, bf16* dq,
                       bf16* dk, bf16* dv);
  // fp32 weight of tensor i. Without the fp32 master only the tensors the constructor lists have one:
  // a new fp32 read of another tensor must join that list (else this throws).
  // LoRA: i is a base tensor (base_layout_ index): a trained one's copy, or the frozen base's.
  float* W(size_t i) {
    const size_t t = of_base_[i];
    if (t == kNoParam && boff32_[i] != kNoParam) return base32_.data() + boff32_[i];
    if (t == kNoParam || off32_[t] == kNoParam)
      throw std::logic_error("ModelCuda::W: no fp32 copy of " + base_layout_.params[i].name);
    return w32_.data() + off32_[t];
  }
  // Base tensor i (base_layout_ index): its bf16 copy; its gradient, nullptr when frozen (LoRA).
  bf16* W16(size_t i) {
    const size_t t = of_base_[i];
    if (t != kNoParam) return w16_.data() + layout_.params[t].offset;
    if (boff16_[i] == kNoParam) throw std::logic_error("ModelCuda::W16: no bf16 copy of " + base_layout_.params[i].name);
    return base16_.data() + boff16_[i];
  }
  // Layer l's q|k|v weight as one (H*D + 2*Hkv*D, C) matrix (one GEMM): in w16_ itself when the
  // three are adjacent, else the copy pack_qkv_weights() gathered.
  const bf16* Wqkv(int l);
  void pack_qkv_weights();
  float* G(size_t i) {
    const size_t t = of_base_[i];
    return t != kNoParam ? g32_.data() + layout_.params[t].offset : nullptr;
  }
  // LoRA's adapter on target t (q .. down) of layer l, split where the layer needs it (lora_cuda.cpp):
  // adapter_in: u (N, rank) = scale x A^T, saved for the backward (x (N, in));
  // adapter_out: y (N, out, rows ld_y apart) += u B^T;
  // adapter_bwd: dB += dy^T u, du = scale dy B, dA += du^T x, dx (N, in) += du A.
  // Each returns at once where layer l has no adapter on t.
  bool has_adapter(int l, int t) const { return lora_.on() && adapters_[size_t(l)][size_t(t)].a != kNoParam; }
  void adapter_in(int l, int t, const bf16* x, int in, DeviceArray<bf16>& u, int N);
  template <class Y>
  void adapter_out(int l, int t, const bf16* u, Y* y, int ld_y, int out, int N);
  template <class Y>
  void adapter_bwd(int l, int t, const bf16* x, int in, const bf16* dy, int ld_dy, int out, const bf16* u, Y* dx, int N);

  ModelDims dims_;
  LoraSpec lora_;
  ParamLayout base_layout_;      // the model's own tensors (LayerParams index it)
  ParamLayout layout_;           // the trainable ones: the flat buffers below (LoRA off: base_layout_)
  std::vector<size_t> of_base_;  // (base tensors) index in layout_, or kNoParam (frozen)
  std::vector<std::array<LoraPair, kLoraTargets>> adapters_;  // [layer][target], LoRA only
  std::vector<size_t> boff16_, boff32_;  // (base tensors) offset of a frozen one in base16_ / base32_, else kNoParam
  DeviceArray<bf16> base16_;     // LoRA: the frozen tensors the GEMMs (and the embedding) read, bf16
  DeviceArray<float> base32_;    // LoRA: the frozen tensors read in fp32 (norms, biases)
  DeviceArray<bf16> du_;         // (N, rank) an adapter's backward scratch
  DeviceArray<bf16> xd_;         // (N, in) lora.dropout: an adapter's dropped input
  DeviceArray<float> dxa_;       // (N, in) lora.dropout: du A before the mask
  uint64_t drop_key_ = 0;        // set_dropout_key
  bool training_ = false;        // run() with its backward: lora.dropout applies
  // lora.dropout in training: x (N, in) with the mask of (drop_key_, l, t) into xd_; else x itself
  const bf16* dropped(int l, int t, const bf16* x, int in, int N);
  ModelExec exec_;
  GpuBuffers sz_;                 // run(): every buffer's size for its micro-batch (gpu_buffers.hpp)
  DeviceArray<double> inv_freq_;  // (head_dim / 2) RoPE's table (src/model/rope.hpp), uploaded once
  double rope_scale_ = 1;         // its attention factor
  kernels::RopeFreqs rope() const { return {inv_freq_.data(), rope_scale_}; }
  SelectionProbe probe_;
  size_t n_ = 0, mem_peak_ = 0;
  bool master_ = true;
  std::vector<size_t> off32_;  // per trainable param: its offset in w32_ (kNoParam: no fp32 copy)
  size_t w32_size_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kernels::cuda::Blas> blas_;
  DeviceArray<float> w32_, g32_;  // (n) master weights (or the fp32-read tensors only), gradients
  DeviceArray<bf16> w16_;         // (n) the copy the GEMMs read
  bool qkv_adjacent_ = true;      // q, k, v weights back to back in every layer (no biases between)
  DeviceArray<bf16> qkvw16_;      // (L, H*D + 2*Hkv*D, C) packed q|k|v weights when not adjacent
  std::vector<std::unique_ptr<Layer>> layers_;  // saved activations, kept between micro-batches
  std::unique_ptr<Layer> work_;                 // train.recompute: the activations of the layer at hand
  // per micro-batch: inputs, final norm, one chunk of logits (model.lm_head_chunk; head16_ holds the
  // bf16 logits, then dlogits over them) and scratch
  DeviceArray<int32_t> tokens_, targets_, pos_, argmax_;
  DeviceArray<float> xs_top_, rstdf_, loss_, dxf_, dx_, dxn_;
  DeviceArray<bf16> xf_, head16_, dx16_, dh_, datt_, dq_, dk_, dv_;
  DeviceArray<bf16> qkv_, dqkv_, dgu_;  // (N, H*D + 2*Hkv*D) packed q|k|v and its gradient, (N, 2F)
  DeviceArray<unsigned char> attn_ws_;
  std::unique_ptr<kernels::cuda::DeviceGating> gating_;  // sparse selection on the device
  kernels::cuda::DeviceSelection dense_sel_;  // every causal block: the dense layers of a sparse run
  bool dense_sel_ready_ = false;              // dense_sel_ holds this micro-batch's (reset by run())
  PhaseClock phases_;
  const PartExchangeCuda* part_ex_ = nullptr;  // run()'s exchange, for the parts' layers
  std::unique_ptr<PartScratchCuda> part_ws_;
};

}  // namespace sb
