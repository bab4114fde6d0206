// The model: a Llama/Qwen-style decoder-only transformer over packed variable-length
// micro-batches, with dense or block-sparse attention. Parameter names and shapes follow
// Hugging Face Llama (and Qwen2 with ModelDims::qkv_bias), so a checkpoint exports to
// LlamaForCausalLM or Qwen2ForCausalLM (src/hf/hf_convert.hpp).
//
// Reads top to bottom in model.cpp: embed -> L x (RMSNorm, attention with RoPE and GQA,
// residual, RMSNorm, SwiGLU MLP, residual) -> RMSNorm -> LM head -> cross-entropy.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.hpp"
#include "src/model/rope.hpp"

namespace sb {

struct ModelDims {
  int n_layers = 2, d_model = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, ffn_dim = 192;
  int vocab = 259;
  bool tied = true;
  bool qkv_bias = false;  // Qwen2: q/k/v projections carry biases (o_proj and the MLP never do)
  bool qk_norm = false;   // Qwen3: RMSNorm over each head's q and k (weights (head_dim)) before RoPE
  double rope_theta = 10000, norm_eps = 1e-5, init_std = 0.02;
  RopeScaling rope_scaling;  // none: plain RoPE (src/model/rope.hpp)
  // Filled from [model] by model_dims() (src/train/settings.hpp).
  int64_t num_params() const;
  // The parameters every token multiplies (the MFU count, src/model/README.md): the decoder
  // layers, the final norm and the LM head (V x C once, tied or not); not the embedding lookup.
  int64_t flop_params() const;
};

// How the model runs, not what it computes: memory-for-time choices that leave the loss and the
// gradients unchanged (up to the order of floating-point sums). From model.lm_head_chunk and
// train.recompute (src/model/README.md).
struct ModelExec {
  int lm_head_chunk = 0;   // tokens per LM head + cross-entropy chunk (0 = auto, head_rows)
  bool recompute = false;  // keep only each layer's input in the forward, recompute it in the backward

  // Tokens per chunk of the head for N tokens at vocabulary V: lm_head_chunk when set, else (0) the
  // most whose logits (`bytes` each: fp32 on the CPU, bf16 on the GPU) fit in kAutoHeadBytes, a
  // multiple of 128 (all N when they fit, as with a byte vocabulary): a large vocabulary never holds
  // the whole (N, V) logits by default.
  static constexpr int64_t kAutoHeadBytes = int64_t(1) << 30;
  int head_rows(int N, int V, int bytes = int(sizeof(float))) const {
    if (lm_head_chunk > 0) return std::min(lm_head_chunk, N);
    const int64_t fit = kAutoHeadBytes / (int64_t(std::max(V, 1)) * int64_t(std::max(bytes, 1)));
    return fit >= N ? N : int(std::min<int64_t>(N, std::max<int64_t>(128, fit / 128 * 128)));
  }
};

struct ParamInfo {
  std::string name;            // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // PyTorch (out, in)
  size_t offset, size;         // into the flat buffer
  bool decay;                  // weight decay applies (matrices, not norms)
};

// Indices into ParamLayout::params of one decoder layer's tensors; the q/k/v biases are kNoParam
// unless ModelDims::qkv_bias.
constexpr size_t kNoParam = SIZE_MAX;
struct LayerParams {
  size_t ln1, q, k, v, o, ln2, gate, up, down;
  size_t q_bias = kNoParam, k_bias = kNoParam, v_bias = kNoParam;
  size_t q_norm = kNoParam, k_norm = kNoParam;  // ModelDims::qk_norm (Qwen3)
};

// The flat parameter buffer, shared by Model<T> and ModelCuda: the tensors in this order (Hugging
// Face names): embed, per layer (ln1, q, [q bias], k, [k bias], v, [v bias], o, [q_norm, k_norm], ln2,
// gate, up, down), final norm, LM head (the embedding when tied), back to back. Biases and norms take
// no weight decay.
struct ParamLayout {
  std::vector<ParamInfo> params;
  size_t embed = 0, norm = 0, head = 0;  // indices into params
  std::vector<LayerParams> layers;
  size_t size = 0;                       // elements of the flat buffer
  ParamLayout() = default;
  explicit ParamLayout(const ModelDims& d);
  const ParamInfo& find(const std::string& name) const;
  // The flat range [begin, end) of layer l's parameters (contiguous).
  std::pair<size_t, size_t> layer_range(int l) const;
};

// How a split document's K and V reach the ranks whose rows need them (attention.part_exchange,
// src/model/README.md "Documents in parts: the K/V exchange"). AllGather: every member gets the
// whole document. Selective: after gating on the shared pooled keys, a member receives only the
// blocks its own rows keep. Auto: selective when it moves well below the all-gather (kAutoShare).
enum class PartExchangeMode { AllGather, Selective, Auto };
constexpr double kAutoShare = 0.5;  // Auto's threshold: selective rows / all-gather rows (bench/results/2026-12-01-kv-exchange.md)

// The one attention settings type ([attention]): the run's (Settings::attention, k empty) and one
// micro-batch's, the run's with a budget per layer (for_budgets; the trainer also sets recall_rows).
struct AttnSettings {
  bool sparse = true;
  // The gate's mode (attention.gate_query, gate_key, gate_sub_blocks; kernels::GatingParams).
  kernels::GateQuery gate_query = kernels::GateQuery::mean;
  kernels::GateKey gate_key = kernels::GateKey::mean;
  int gate_sub_blocks = 4;
  // Layer l gates (sparse, not one of attention.dense_layers), and its gating parameters.
  bool sparse_at(int l) const { return sparse && !(size_t(l) < dense.size() && dense[size_t(l)]); }
  kernels::GatingParams gating(int l) const {
    return {l >= 0 ? k[size_t(l)] : 0, local_blocks, theta, gate_query, gate_key, gate_sub_blocks};
  }
  int recall_rows = 0;  // sparse: rows per layer whose true recall is measured (balance.recall_rows), 0: none
  int block_size = 32, local_blocks = 1;
  double theta = 8;
  std::vector<int> k;  // (n_layers) budget per layer
  std::vector<uint8_t> dense;  // (n_layers) 1: the layer attends densely (attention.dense_layers); empty: none
  PartExchangeMode part_exchange = PartExchangeMode::Auto;  // attention.part_exchange (the trainer sets it on PartGroups)
  AttnSettings for_budgets(std::vector<int> budgets) const {  // these settings, one budget per layer
    AttnSettings a = *this;
    a.k = std::move(budgets);
    return a;
  }
  AttnSettings at_k0(int n_layers, int k0) const { return for_budgets(std::vector<int>(size_t(n_layers), k0)); }  // every layer at k0
};

// Diagnostics (eval --diagnose, src/eval/diagnose.hpp): called in a sparse forward after layer l's
// gating, with the layer's post-RoPE q (N, H*D) and k (N, Hkv*D) on the host (float) and the
// selection of the whole sequences, which it may change (the oracle gate adds key blocks).
using SelectionProbe = std::function<void(int l, const float* q, const float* k, kernels::BlockSelection& sel)>;

// True recall (kernels::true_recall) of `n` rows of `sel` drawn without a pattern from the layer
// and the batch (the same rows on every run): their count and sum go into st.true_rows/true_recall_sum.
std::vector<int64_t> recall_sample(int64_t rows, int n, int layer, int64_t tokens);

// What one micro-batch's forward/backward observed, for the balancer and the log.
struct MicroBatchStats {
  double loss_sum = 0;     // summed cross-entropy over targeted tokens
  int64_t targets = 0;     // targeted tokens
  int64_t correct = 0;     // greedy predictions equal to the target
  std::vector<kernels::GatingStats> gating;  // (n_layers)
  double attn_ms = 0, gating_ms = 0, total_ms = 0;  // wall times (fwd+bwd)
};

// Context parallelism (data.long_docs = "split"): one document split over a group of ranks that
// compute its attention together, exactly. This rank holds `pieces` of it: token ranges [begin, end)
// of the document, ascending, each starting on a block boundary (attention.block_size) and ending on
// one or at the document's end, so every query block lives on one rank. Their tokens are packed back
// to back after the batch's whole sequences (rows [cu_seqlens.back(), n()) of the micro-batch).
struct DocPart {
  int group = 0;        // which group computes it (an index the exchange understands)
  int32_t doc_len = 0;  // tokens of the whole document
  std::vector<std::pair<int32_t, int32_t>> pieces;
  int32_t local_tokens() const;
};

// Who needs which rows of a split document (the selective exchange): every member's token ranges
// [begin, end) of blocks other members own that its rows keep, ascending; shared by share_needs.
struct PartNeeds {
  std::vector<std::vector<std::pair<int32_t, int32_t>>> need;  // (group size)
  int member = 0;              // this rank's index in the group
  int64_t selective_rows = 0;  // rows the selective exchange moves, summed over members
  int64_t allgather_rows = 0;  // rows the all-gather moves: (G - 1) * doc_len
  int64_t rows(int m) const;  // member m's needed rows
};

// The exchange of a split document's rows, passed in by the trainer (src/parts/groups.hpp): the
// model itself never communicates. All are collective over the part's group, called in the same
// order on every member (layer by layer, the parts in batch order).
template <class T>
struct PartExchange {
  // This rank's rows (local_tokens() x width) -> the whole document's rows (doc_len x width), in
  // document order, from every member.
  std::function<void(const DocPart&, std::span<const T> mine, std::span<T> whole, int width)> gather;
  // The sum over the group of every member's whole-document rows (doc_len x width); this rank gets
  // the rows it owns (local_tokens() x width), in its packed order.
  std::function<void(const DocPart&, std::span<const T> whole, std::span<T> mine, int width)> reduce_scatter;
  PartExchangeMode mode = PartExchangeMode::AllGather;  // the CPU path's choice (CUDA: always AllGather)
  // Selective exchange. gather_blocks: every member's values of its blocks (its blocks x width, in
  // document order; blocks of block_size tokens) -> every block's (blocks of the document x width).
  std::function<void(const DocPart&, std::span<const double> mine, std::span<double> whole, int width,
                     int block_size)> gather_blocks;
  // Every member's needs from this rank's (its ranges, ascending, none of them its own).
  std::function<PartNeeds(const DocPart&, const std::vector<std::pair<int32_t, int32_t>>& mine)> share_needs;
  // got (rows(me) x width): the rows of this rank's needs, in their order, from their owners.
  std::function<void(const DocPart&, const PartNeeds&, std::span<const T> mine, std::span<T> got, int width)> fetch;
  // The reverse of fetch: each member's `got` rows go back to their owners, who add them to `mine`.
  std::function<void(const DocPart&, const PartNeeds&, std::span<const T> got, std::span<T> mine, int width)>
      give_back;
};

// A packed micro-batch: documents (or windows) back to back.
struct PackedBatch {
  std::vector<int32_t> tokens;      // (N)
  std::vector<int32_t> targets;     // (N) next token inside the same sequence, -1 at its end
  std::vector<int32_t> pos;         // (N) position inside the sequence (RoPE)
  std::vector<int32_t> cu_seqlens;  // (ndocs + 1) the whole sequences
  std::vector<DocPart> parts;     // this rank's parts of documents in parts, after the sequences
  int ndocs() const { return int(cu_seqlens.size()) - 1; }
  int n() const { return int(tokens.size()); }
  // Append one sequence; a sequence of one token has no target.
  void add(const std::vector<uint32_t>& seq);
  // Append the first n tokens of `seq` as rows of a part's piece (no new sequence), at positions
  // pos0.., each targeting the next token of `seq` (-1 past its end: the document's last token).
  void add_rows(const std::vector<uint32_t>& seq, int32_t pos0, size_t n);
};

// Model FLOPs of one forward + backward over `tokens` tokens whose layers' gating reported
// `gating` (one per layer, blocks of `block_size`): 6 * flop_params() * tokens plus, per layer,
// 3 x the forward attention's 4 * H * D FLOPs per query-key pair, pairs per query head =
// block_size^2 * (kept blocks - rows / 2) / n_kv_heads (the diagonal block counted as half), the
// formula of bench/torch/torch_model_ref.py. Recomputation (train.recompute) is not counted.
double train_flops(const ModelDims& s, int64_t tokens, const std::vector<kernels::GatingStats>& gating,
                   int block_size);
// Attention of this rank's query rows of one split document against the whole document
// (src/model/part_attention.cpp). q, att, dq point at the part's first packed row (local_tokens(),
// H*D); k, v, dk, dv likewise (local_tokens(), Hkv*D); lse (local_tokens(), H). The forward gathers
// K and V, gates its own query rows only (or selects all causal blocks) against every block of the
// whole document, so a row keeps exactly the blocks one rank holding the document would keep, and
// `sel` has only its own query rows; it
// returns the gating statistics of those rows. The backward gathers K and V again (nothing of the
// whole document stays in memory between the passes) and returns dK, dV to the keys' owners.
template <class T>
kernels::GatingStats part_attention_fwd(const DocPart& sh, const PartExchange<T>& ex, const T* q, const T* k,
                                         const T* v, kernels::AttnShape s, bool sparse,
                                         kernels::GatingParams p, kernels::BlockSelection& sel, T* att, T* lse);
template <class T>
void part_attention_bwd(const DocPart& sh, const PartExchange<T>& ex, const T* q, const T* k, const T* v,
                         const T* att, const T* lse, const T* datt, kernels::AttnShape s,
                         const kernels::BlockSelection& sel, T* dq, T* dk, T* dv);

// ---------------------------------------------------------------------------------------------
// LoRA ([lora], src/model/README.md "LoRA"): low-rank adapters on a frozen base. Each target
// projection y = W x becomes y = W x + (alpha / rank) B (A x), A (rank, in), B (out, rank); W takes
// no gradient. The trainable tensors (the adapters and the `train_also` parts: embedding, norms,
// head) form their own ParamLayout, the one the optimizer, ZeRO-1, the gradient reduction and the
// checkpoints see (Model::layout()); the base keeps the full layout (Model::base_layout()).
// Implemented in lora.cpp.

// The projections an adapter can sit on; PEFT's module names (q_proj .. down_proj).
constexpr int kLoraTargets = 7;
inline constexpr std::array<const char*, kLoraTargets> kLoraTargetNames = {"q", "k", "v", "o", "gate", "up", "down"};
inline constexpr std::array<const char*, kLoraTargets> kLoraModuleNames = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                          "gate_proj", "up_proj", "down_proj"};

struct LoraSpec {
  int rank = 0;  // lora.rank; 0: LoRA off (every parameter trains)
  double alpha = 16;
  std::array<bool, kLoraTargets> targets{true, true, true, true, true, true, true};
  bool embed = false, norm = false, head = false;  // lora.train_also: trained in full beside the adapters
  double dropout = 0;  // lora.dropout: on the adapters' input x in training (kernels/lora_dropout.hpp)
  bool on() const { return rank > 0; }
  double scale() const { return alpha / rank; }
};

// One adapter's two tensors: indices into LoraLayout::train.params.
struct LoraPair {
  size_t a = kNoParam, b = kNoParam;
};

struct LoraLayout {
  ParamLayout train;            // the trainable tensors, back to back
  std::vector<size_t> of_base;  // (base params) a base tensor's index in `train` (train_also), else kNoParam
  std::vector<std::array<LoraPair, kLoraTargets>> adapters;  // [layer][target]
};

// Base layer I's weight index of target t (q, k, v, o, gate, up, down).
size_t target_param(const LayerParams& I, int t);

// The trainable layout: the embedding first (train_also embed, or head when tied), then per layer
// the norms (train_also norm: input_layernorm, q_norm, k_norm, post_attention_layernorm) and each
// target's lora_A (rank, in) then lora_B (out, rank), named as PEFT names them under the model
// ("model.layers.0.self_attn.q_proj.lora_A.weight"), then the final norm and an untied head.
// Adapters take weight decay (PEFT leaves them to the optimizer's). Off: the base layout itself.
LoraLayout lora_layout(const ParamLayout& base, const ModelDims& d, const LoraSpec& s);

// The tensors (indices into `base`) the GPU model reads in fp32: the embedding, the norms and the
// q/k/v biases; every other weight only through bf16 GEMMs (src/model/model_cuda.hpp). With LoRA a
// frozen embedding is read from its bf16 copy instead (src/model/lora_cuda.cpp).
std::vector<size_t> fp32_read_params(const ParamLayout& base);

// One budget per layer, every token id inside the vocabulary (the error names model.vocab_size).
void check_inputs(const PackedBatch& b, const AttnSettings& a, const ModelDims& s);

template <class T>
class Model {
 public:
  // lora.on(): the base is frozen and weights()/grads()/layout() are the trainable tensors only.
  explicit Model(const ModelDims& shape, const LoraSpec& lora = {});
  const ModelDims& shape() const { return shape_; }
  const LoraSpec& lora() const { return lora_; }
  // The trainable tensors (every tensor when LoRA is off): what the optimizer and checkpoints see.
  const ParamLayout& layout() const { return layout_; }
  const std::vector<ParamInfo>& params() const { return layout_.params; }
  const ParamInfo& param(const std::string& name) const;
  // The model's own tensors (Hugging Face names); the same as layout() when LoRA is off.
  const ParamLayout& base_layout() const { return base_layout_; }
  const std::vector<size_t>& of_base() const { return of_base_; }
  const std::vector<std::array<LoraPair, kLoraTargets>>& adapters() const { return adapters_; }

  // normal(0, init_std) from `seed` (deterministic, own generator); output projections
  // (o_proj, down_proj) scaled by 1/sqrt(2 * n_layers); norms at 1, biases at 0. LoRA: that is the
  // base; then each lora_A uniform(-1/sqrt(in), 1/sqrt(in)) (PEFT: kaiming_uniform_(a = sqrt(5)))
  // from a generator of its own seeded by `seed`, each lora_B zero, the train_also parts copied.
  // draw_base = false: the matrices stay zero (weights given next, e.g. --init-from: drawing 7.6B
  // normals took ~6 minutes on one core for nothing); the adapters are drawn all the same.
  void init(uint64_t seed, bool draw_base = true);
  // The base weights (base_layout() order; LoRA off: weights()). set_base also copies the base's
  // train_also parts into weights() unless told not to (a resumed run's trained copies stay).
  const std::vector<T>& base() const { return lora_.on() ? base_ : w_; }
  void set_base(std::vector<T> w, bool copy_train_also = true);
  // The base with every adapter folded in (W + (alpha / rank) B A) and the train_also parts from
  // weights(): the model a merged export writes (base_layout() order).
  std::vector<T> merged() const;

  // Forward and backward of one micro-batch. Gradients are ACCUMULATED into grads(),
  // scaled by `loss_scale` (1 / global target count makes the sum over ranks the mean).
  // A batch with parts needs `ex` (collective over each part's group). layer_done (optional) is
  // called with l once layer l's backward is done: its gradients (layer_range(l)) are complete
  // (the engine starts their reduction there, as on the GPU).
  MicroBatchStats forward_backward(const PackedBatch& b, const AttnSettings& a, T loss_scale,
                                   const PartExchange<T>* ex = nullptr,
                                   const std::function<void(int)>& layer_done = {});
  // Forward only (eval); `argmax` (optional, N) receives greedy predictions.
  MicroBatchStats forward(const PackedBatch& b, const AttnSettings& a, std::vector<int32_t>* argmax = nullptr,
                          const PartExchange<T>* ex = nullptr);
  // The forward's logits of rows [first_row, N) ((N - first_row) x V, row-major): the same layers as
  // forward (dense or sparse per `a`), the LM head on those rows only (generate; no parts).
  std::vector<T> forward_logits(const PackedBatch& b, const AttnSettings& a, int first_row = 0);

  std::vector<T>& weights() { return w_; }
  const std::vector<T>& weights() const { return w_; }
  std::vector<T>& grads() { return g_; }
  void zero_grads();
  const ModelExec& exec() const { return exec_; }
  void set_exec(const ModelExec& e) { exec_ = e; }
  void set_probe(SelectionProbe p) { probe_ = std::move(p); }  // empty: none
  // lora.dropout > 0: the next forward_backward's draw (kernels::dropout_micro_batch_key; the
  // engine sets it per micro-batch). forward() (eval) never drops.
  void set_dropout_key(uint64_t k) { drop_key_ = k; }

 private:
  struct Layer;  // saved activations of one layer
  MicroBatchStats run(const PackedBatch& b, const AttnSettings& a, T loss_scale, bool backward,
                      std::vector<int32_t>* argmax, const PartExchange<T>* ex,
                      const std::function<void(int)>& layer_done = {});
  void layer_forward(int l, const PackedBatch& b, const AttnSettings& a, std::vector<T>& x, Layer& A, bool gate,
                     MicroBatchStats& st, const PartExchange<T>* ex);
  void probe_and_sample(int l, const AttnSettings& a, const kernels::AttnShape& ashape, const PackedBatch& b, Layer& A,
                        MicroBatchStats& st);
  // Base tensor idx (base_layout()): its weights (a train_also copy in w_, else the base) and its
  // gradient (nullptr: frozen).
  const T* W(size_t idx) const {
    const size_t t = of_base_[idx];
    return t != kNoParam ? w_.data() + layout_.params[t].offset : base_.data() + base_layout_.params[idx].offset;
  }
  T* G(size_t idx) {
    const size_t t = of_base_[idx];
    return t != kNoParam ? g_.data() + layout_.params[t].offset : nullptr;
  }
  // Projection target t of layer l (lora.cpp): y (N, out) = x W^T + scale (x A^T) B^T, u (N, rank)
  // = scale x A^T saved for the backward (untouched without an adapter); backward: dx += dy W +
  // scale (dy B) A, dA, dB accumulated, dW when W trains (never with LoRA on).
  void proj_fwd(int l, int t, const T* x, T* y, int N, int in, int out, std::vector<T>& u);
  void proj_bwd(int l, int t, const T* x, const T* dy, T* dx, int N, int in, int out, const std::vector<T>& u);
  void init_adapters(uint64_t seed);  // LoRA: A, B and the train_also copies (lora.cpp)
  uint64_t drop_key_ = 0;  // set_dropout_key
  bool training_ = false;  // run() with its backward: lora.dropout applies

  ModelDims shape_;
  LoraSpec lora_;
  ParamLayout base_layout_;  // every tensor of the model
  ParamLayout layout_;       // the trainable ones (LoRA off: base_layout_)
  std::vector<size_t> of_base_;  // (base tensors) index in layout_ or kNoParam (frozen)
  std::vector<std::array<LoraPair, kLoraTargets>> adapters_;  // [layer][target], LoRA only
  std::vector<T> base_;      // LoRA: the frozen base (base_layout_ order); off: empty, w_ is the model
  RopeTable rope_;  // the inverse frequencies and attention factor, from shape_ once
  kernels::RopeFreqs freqs() const { return {rope_.inv_freq.data(), rope_.scale}; }
  std::vector<T> w_, g_;  // flat parameters and gradients, in layout order
  ModelExec exec_;
  SelectionProbe probe_;
};

}  // namespace sb
