// The model: a Llama/Qwen-style decoder-only transformer over packed variable-length
// micro-batches, with dense or block-sparse attention. Parameter names and shapes follow
// Hugging Face Llama (and Qwen2 with ModelDims::qkv_bias), so a checkpoint exports to
// LlamaForCausalLM or Qwen2ForCausalLM (src/hf/hf_convert.hpp).
//
// Reads top to bottom in model.cpp: embed -> L x (RMSNorm, attention with RoPE and GQA,
// residual, RMSNorm, SwiGLU MLP, residual) -> RMSNorm -> LM head -> cross-entropy.
#pragma once
#include <algorithm>
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

// Diagnostics (eval --diagnose, src/train/diagnose.hpp): called in a sparse forward after layer l's
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

// One budget per layer, every token id inside the vocabulary (the error names model.vocab_size).
void check_inputs(const PackedBatch& b, const AttnSettings& a, const ModelDims& s);

template <class T>
class Model {
 public:
  explicit Model(const ModelDims& shape);
  const ModelDims& shape() const { return shape_; }
  const ParamLayout& layout() const { return layout_; }
  const std::vector<ParamInfo>& params() const { return layout_.params; }
  const ParamInfo& param(const std::string& name) const;

  // normal(0, init_std) from `seed` (deterministic, own generator); output projections
  // (o_proj, down_proj) scaled by 1/sqrt(2 * n_layers); norms at 1, biases at 0.
  void init(uint64_t seed);

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

 private:
  struct Layer;  // saved activations of one layer
  MicroBatchStats run(const PackedBatch& b, const AttnSettings& a, T loss_scale, bool backward,
                      std::vector<int32_t>* argmax, const PartExchange<T>* ex,
                      const std::function<void(int)>& layer_done = {});
  void layer_forward(int l, const PackedBatch& b, const AttnSettings& a, std::vector<T>& x, Layer& A, bool gate,
                     MicroBatchStats& st, const PartExchange<T>* ex);
  void probe_and_sample(int l, const AttnSettings& a, const kernels::AttnShape& ashape, const PackedBatch& b, Layer& A,
                        MicroBatchStats& st);
  T* W(size_t idx) { return w_.data() + layout_.params[idx].offset; }
  T* G(size_t idx) { return g_.data() + layout_.params[idx].offset; }

  ModelDims shape_;
  ParamLayout layout_;
  RopeTable rope_;  // the inverse frequencies and attention factor, from shape_ once
  kernels::RopeFreqs freqs() const { return {rope_.inv_freq.data(), rope_.scale}; }
  std::vector<T> w_, g_;  // flat parameters and gradients, in layout order
  ModelExec exec_;
  SelectionProbe probe_;
};

}  // namespace sb
