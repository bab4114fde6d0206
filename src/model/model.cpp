#include "src/model/model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <stdexcept>
#include <type_traits>

#include "base/error.hpp"

namespace sb {

namespace k = kernels;
using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------------
// Shape and parameters

int64_t ModelDims::num_params() const {
  int64_t C = d_model, H = n_heads, Hkv = n_kv_heads, D = head_dim, F = ffn_dim, V = vocab;
  int64_t per_layer = 2 * C + H * D * C + 2 * Hkv * D * C + C * H * D + 3 * F * C + (qkv_bias ? H * D + 2 * Hkv * D : 0) +
                      (qk_norm ? 2 * D : 0);
  return V * C + n_layers * per_layer + C + (tied ? 0 : V * C);
}

int64_t ModelDims::flop_params() const {
  int64_t C = d_model, H = n_heads, Hkv = n_kv_heads, D = head_dim, F = ffn_dim, V = vocab;
  int64_t per_layer = 2 * C + H * D * C + 2 * Hkv * D * C + C * H * D + 3 * F * C + (qk_norm ? 2 * D : 0);
  return n_layers * per_layer + C + V * C;
}

double train_flops(const ModelDims& s, int64_t tokens, const std::vector<kernels::GatingStats>& gating,
                   int block_size) {
  double f = 6.0 * double(s.flop_params()) * double(tokens);
  const double bs2 = double(block_size) * block_size;
  for (const auto& g : gating) {
    const double pairs = bs2 * (g.kept_blocks - 0.5 * g.rows) / s.n_kv_heads;  // per query head
    f += 3.0 * 4.0 * s.n_heads * s.head_dim * std::max(0.0, pairs);
  }
  return f;
}

ParamLayout::ParamLayout(const ModelDims& s) {
  const int64_t C = s.d_model, HD = int64_t(s.n_heads) * s.head_dim, KD = int64_t(s.n_kv_heads) * s.head_dim;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay) {
    size_t n = 1;
    for (auto d : shape) n *= size_t(d);
    params.push_back({std::move(name), std::move(shape), size, n, decay});
    size += n;
    return params.size() - 1;
  };
  embed = add("model.embed_tokens.weight", {s.vocab, C}, true);
  for (int l = 0; l < s.n_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    LayerParams L;
    L.ln1 = add(p + "input_layernorm.weight", {C}, false);
    L.q = add(p + "self_attn.q_proj.weight", {HD, C}, true);
    if (s.qkv_bias) L.q_bias = add(p + "self_attn.q_proj.bias", {HD}, false);
    L.k = add(p + "self_attn.k_proj.weight", {KD, C}, true);
    if (s.qkv_bias) L.k_bias = add(p + "self_attn.k_proj.bias", {KD}, false);
    L.v = add(p + "self_attn.v_proj.weight", {KD, C}, true);
    if (s.qkv_bias) L.v_bias = add(p + "self_attn.v_proj.bias", {KD}, false);
    L.o = add(p + "self_attn.o_proj.weight", {C, HD}, true);
    if (s.qk_norm) {  // after o_proj, so q, k and v stay adjacent (the GPU's packed projection)
      L.q_norm = add(p + "self_attn.q_norm.weight", {s.head_dim}, false);
      L.k_norm = add(p + "self_attn.k_norm.weight", {s.head_dim}, false);
    }
    L.ln2 = add(p + "post_attention_layernorm.weight", {C}, false);
    L.gate = add(p + "mlp.gate_proj.weight", {s.ffn_dim, C}, true);
    L.up = add(p + "mlp.up_proj.weight", {s.ffn_dim, C}, true);
    L.down = add(p + "mlp.down_proj.weight", {C, s.ffn_dim}, true);
    layers.push_back(L);
  }
  norm = add("model.norm.weight", {C}, false);
  head = s.tied ? embed : add("lm_head.weight", {s.vocab, C}, true);
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return p;
  throw Error("no parameter named '" + name + "'");
}

std::pair<size_t, size_t> ParamLayout::layer_range(int l) const {
  const LayerParams& I = layers.at(size_t(l));
  size_t lo = SIZE_MAX, hi = 0;
  for (size_t i : {I.ln1, I.q, I.k, I.v, I.o, I.ln2, I.gate, I.up, I.down, I.q_bias, I.k_bias, I.v_bias, I.q_norm, I.k_norm}) {
    if (i == kNoParam) continue;
    lo = std::min(lo, params[i].offset);
    hi = std::max(hi, params[i].offset + params[i].size);
  }
  return {lo, hi};
}

template <class T>
Model<T>::Model(const ModelDims& s, const LoraSpec& lora)
    : shape_(s), lora_(lora), base_layout_(s), rope_(rope_table(s.head_dim, s.rope_theta, s.rope_scaling)) {
  LoraLayout ll = lora_layout(base_layout_, s, lora);
  layout_ = std::move(ll.train);
  of_base_ = std::move(ll.of_base);
  adapters_ = std::move(ll.adapters);
  if (lora.on()) base_.assign(base_layout_.size, T(0));
  w_.assign(layout_.size, T(0));
  g_.assign(layout_.size, T(0));
}

template <class T>
const ParamInfo& Model<T>::param(const std::string& name) const {
  return layout_.find(name);
}

template <class T>
void Model<T>::init(uint64_t seed, bool draw_base) {
  // Own Box-Muller over mt19937_64: std::normal_distribution differs between standard libraries.
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
  auto normal = [&] {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  };
  const double out_scale = 1.0 / std::sqrt(2.0 * shape_.n_layers);
  std::vector<T>& base = lora_.on() ? base_ : w_;
  for (const auto& p : base_layout_.params) {
    T* w = base.data() + p.offset;
    if (!p.decay) {  // norms start at 1, biases at 0
      const T v = p.name.ends_with(".bias") ? T(0) : T(1);
      for (size_t i = 0; i < p.size; ++i) w[i] = v;
      continue;
    }
    if (!draw_base) {
      std::fill(w, w + p.size, T(0));
      continue;
    }
    bool out_proj = p.name.find("o_proj") != std::string::npos || p.name.find("down_proj") != std::string::npos;
    double std = shape_.init_std * (out_proj ? out_scale : 1.0);
    for (size_t i = 0; i < p.size; ++i) w[i] = T(std * normal());
  }
  if (lora_.on()) init_adapters(seed);
}

template <class T>
void Model<T>::zero_grads() {
  std::fill(g_.begin(), g_.end(), T(0));
}

void check_inputs(const PackedBatch& b, const AttnSettings& a, const ModelDims& s) {
  if (int(a.k.size()) != s.n_layers) throw std::logic_error("AttnSettings.k must hold one budget per layer");
  if (!a.dense.empty() && int(a.dense.size()) != s.n_layers)
    throw std::logic_error("AttnSettings.dense must hold one flag per layer (or none)");
  int64_t rows = b.cu_seqlens.empty() ? 0 : b.cu_seqlens.back();
  for (const DocPart& sh : b.parts) rows += sh.local_tokens();
  if (rows != b.n() || (!b.parts.empty() && b.cu_seqlens.empty()))
    throw std::logic_error("PackedBatch: the sequences and the parts' pieces do not add up to its tokens");
  for (int32_t t : b.tokens)
    if (t < 0 || t >= s.vocab)
      throw Error("token id " + std::to_string(t) + " is outside the model's vocabulary (model.vocab_size = " +
                  std::to_string(s.vocab) + ")");
}

void PackedBatch::add(const std::vector<uint32_t>& seq) {
  if (cu_seqlens.empty()) cu_seqlens.push_back(0);
  for (size_t i = 0; i < seq.size(); ++i) {
    tokens.push_back(int32_t(seq[i]));
    targets.push_back(i + 1 < seq.size() ? int32_t(seq[i + 1]) : -1);
    pos.push_back(int32_t(i));
  }
  cu_seqlens.push_back(int32_t(tokens.size()));
}

void PackedBatch::add_rows(const std::vector<uint32_t>& seq, int32_t pos0, size_t n) {
  for (size_t i = 0; i < n && i < seq.size(); ++i) {
    tokens.push_back(int32_t(seq[i]));
    targets.push_back(i + 1 < seq.size() ? int32_t(seq[i + 1]) : -1);
    pos.push_back(pos0 + int32_t(i));
  }
}

// ---------------------------------------------------------------------------------------------
// Forward and backward

// Activations of one layer saved for the backward pass.
template <class T>
struct Model<T>::Layer {
  std::vector<T> x_in;        // (N, C) residual stream entering the layer
  std::vector<T> xn, rstd1;   // (N, C), (N)
  std::vector<T> q, kk, v;    // (N, H*D), (N, Hkv*D), (N, Hkv*D) after RoPE
  std::vector<T> q_raw, k_raw, rstdq, rstdk;  // qk_norm: q, k before their norms; (N*H), (N*Hkv)
  k::BlockSelection sel;
  std::vector<k::BlockSelection> part_sel;  // (parts) this rank's rows of each split document
  std::vector<T> att, lse;    // (N, H*D), (N, H)
  std::vector<T> x_mid;       // (N, C) after the attention residual
  std::vector<T> xn2, rstd2;  // (N, C), (N)
  std::vector<T> gate, up, h; // (N, F) x3
  std::array<std::vector<T>, kLoraTargets> u;  // LoRA: (N, rank) scale * A x of each target
};

template <class T>
MicroBatchStats Model<T>::forward_backward(const PackedBatch& b, const AttnSettings& a, T loss_scale,
                                           const PartExchange<T>* ex,
                                           const std::function<void(int)>& layer_done) {
  return run(b, a, loss_scale, true, nullptr, ex, layer_done);
}

template <class T>
MicroBatchStats Model<T>::forward(const PackedBatch& b, const AttnSettings& a, std::vector<int32_t>* argmax,
                                  const PartExchange<T>* ex) {
  return run(b, a, T(1), false, argmax, ex);
}

template <class T>
std::vector<T> Model<T>::forward_logits(const PackedBatch& b, const AttnSettings& a, int first_row) {
  const int N = b.n(), C = shape_.d_model, V = shape_.vocab;
  check_inputs(b, a, shape_);
  if (!b.parts.empty() || first_row < 0 || first_row >= N)
    throw std::logic_error("Model::forward_logits: whole sequences only, first_row in [0, N)");
  training_ = false;  // no lora.dropout
  MicroBatchStats st;
  st.gating.resize(size_t(shape_.n_layers));
  std::vector<T> x(size_t(N) * C), xf(size_t(N) * C), rstd(static_cast<size_t>(N));  // (N, C), (N, C), (N)
  k::embedding_fwd(b.tokens.data(), W(layout_.embed), x.data(), N, C);
  for (int l = 0; l < shape_.n_layers; ++l) {
    Layer A;
    layer_forward(l, b, a, x, A, true, st, nullptr);
  }
  k::rmsnorm_fwd(x.data(), W(layout_.norm), xf.data(), rstd.data(), N, C, shape_.norm_eps);
  std::vector<T> logits(size_t(N - first_row) * V);
  k::linear_fwd(xf.data() + size_t(first_row) * C, W(layout_.head), logits.data(), N - first_row, C, V);
  return logits;
}

static void add_stats(k::GatingStats& a, const k::GatingStats& b) {
  a.rows += b.rows, a.kept_blocks += b.kept_blocks, a.causal_blocks += b.causal_blocks, a.recall_sum += b.recall_sum;
}

// Forward of decoder layer l: x (N, C) in place from the layer's input to its output; A receives
// what the backward needs. gate: select the blocks into A.sel (recomputation reuses them).
// A split document's rows (after the whole sequences) attend through its exchange ex; their
// gating runs again when recomputing (every group member recomputes the same layers in the same
// order, so the collectives match), and its statistics count once.
template <class T>
void Model<T>::layer_forward(int l, const PackedBatch& b, const AttnSettings& a, std::vector<T>& x, Layer& A,
                             bool gate, MicroBatchStats& st, const PartExchange<T>* ex) {
  const ModelDims& s = shape_;
  const int N = b.n(), C = s.d_model, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, F = s.ffn_dim;
  const int HD = H * D, KD = Hkv * D, nd = b.ndocs();
  const k::AttnShape ashape{H, Hkv, D, a.block_size};
  auto sized = [](std::vector<T>& v, size_t n) { v.assign(n, T(0)); return v.data(); };
  std::vector<T> tmp(size_t(N) * C);  // (N, C) branch output before the residual add
  const LayerParams& I = base_layout_.layers[size_t(l)];
  A.x_in = x;
  // attention block
  k::rmsnorm_fwd(x.data(), W(I.ln1), sized(A.xn, size_t(N) * C), sized(A.rstd1, N), N, C, s.norm_eps);
  proj_fwd(l, 0, A.xn.data(), sized(A.q, size_t(N) * HD), N, C, HD, A.u[0]);
  proj_fwd(l, 1, A.xn.data(), sized(A.kk, size_t(N) * KD), N, C, KD, A.u[1]);
  proj_fwd(l, 2, A.xn.data(), sized(A.v, size_t(N) * KD), N, C, KD, A.u[2]);
  if (s.qkv_bias) {  // the q/k/v biases, when the model has them, go in before RoPE as in Qwen2
    k::bias_add_fwd(A.q.data(), W(I.q_bias), N, HD);
    k::bias_add_fwd(A.kk.data(), W(I.k_bias), N, KD);
    k::bias_add_fwd(A.v.data(), W(I.v_bias), N, KD);
  }
  if (s.qk_norm) {  // Qwen3: each head's q and k (D) RMS-normed, before RoPE
    A.q_raw = A.q, A.k_raw = A.kk;
    k::rmsnorm_fwd(A.q_raw.data(), W(I.q_norm), A.q.data(), sized(A.rstdq, size_t(N) * H), N * H, D, s.norm_eps);
    k::rmsnorm_fwd(A.k_raw.data(), W(I.k_norm), A.kk.data(), sized(A.rstdk, size_t(N) * Hkv), N * Hkv, D, s.norm_eps);
  }
  k::rope_fwd(A.q.data(), b.pos.data(), N, H, D, freqs());
  k::rope_fwd(A.kk.data(), b.pos.data(), N, Hkv, D, freqs());
  if (gate) {
    auto tg = Clock::now();
    st.gating[l] = a.sparse_at(l) ? k::gate_blocks(A.q.data(), A.kk.data(), b.cu_seqlens.data(), nd, ashape,
                                                   a.gating(l), A.sel)
                                  : k::select_all_causal(b.cu_seqlens.data(), nd, ashape, A.sel);
    st.gating_ms += ms_since(tg);
  }
  if (gate && a.sparse_at(l)) probe_and_sample(l, a, ashape, b, A, st);
  auto ta = Clock::now();
  k::block_attention_fwd(A.q.data(), A.kk.data(), A.v.data(), b.cu_seqlens.data(), nd, ashape, A.sel,
                         sized(A.att, size_t(N) * HD), sized(A.lse, size_t(N) * H));
  A.part_sel.resize(b.parts.size());  // a part's gating, attention and exchange count as attention
  const size_t n_seq = b.cu_seqlens.empty() ? 0 : size_t(b.cu_seqlens.back());  // rows of the whole sequences
  for (size_t i = 0, at = n_seq; i < b.parts.size(); at += size_t(b.parts[i++].local_tokens())) {
    const k::GatingStats g = part_attention_fwd(b.parts[i], *ex, A.q.data() + at * HD, A.kk.data() + at * KD,
                                                 A.v.data() + at * KD, ashape, a.sparse_at(l), a.gating(l),
                                                 A.part_sel[i],
                                                 A.att.data() + at * HD, A.lse.data() + at * H);
    if (gate) add_stats(st.gating[l], g);
  }
  st.attn_ms += ms_since(ta);
  proj_fwd(l, 3, A.att.data(), tmp.data(), N, HD, C, A.u[3]);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  A.x_mid = x;
  // MLP block
  k::rmsnorm_fwd(x.data(), W(I.ln2), sized(A.xn2, size_t(N) * C), sized(A.rstd2, N), N, C, s.norm_eps);
  proj_fwd(l, 4, A.xn2.data(), sized(A.gate, size_t(N) * F), N, C, F, A.u[4]);
  proj_fwd(l, 5, A.xn2.data(), sized(A.up, size_t(N) * F), N, C, F, A.u[5]);
  k::swiglu_fwd(A.gate.data(), A.up.data(), sized(A.h, size_t(N) * F), size_t(N) * F);
  proj_fwd(l, 6, A.h.data(), tmp.data(), N, F, C, A.u[6]);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
}

std::vector<int64_t> recall_sample(int64_t rows, int n, int layer, int64_t tokens) {
  std::vector<int64_t> out;
  if (rows <= 0 || n <= 0) return out;
  uint64_t x = 0x9E3779B97F4A7C15ull * uint64_t(layer + 1) ^ uint64_t(tokens);  // splitmix64 stream
  for (int i = 0; i < n; ++i) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    out.push_back(int64_t((z ^ (z >> 31)) % uint64_t(rows)));
  }
  return out;
}

// After a sparse layer's gating: the diagnostics probe (float models), then the true recall of
// a.recall_rows sampled rows into the layer's stats.
template <class T>
void Model<T>::probe_and_sample(int l, const AttnSettings& a, const k::AttnShape& ashape, const PackedBatch& b, Layer& A,
                                MicroBatchStats& st) {
  if constexpr (std::is_same_v<T, float>)
    if (probe_) probe_(l, A.q.data(), A.kk.data(), A.sel);
  const int64_t rows = A.sel.doc_row_base.empty() ? 0 : A.sel.doc_row_base.back();
  if (a.recall_rows <= 0 || rows == 0) return;
  const std::vector<int64_t> pick = recall_sample(rows, a.recall_rows, l, b.n());
  std::vector<float> got(pick.size());
  k::true_recall(A.q.data(), A.kk.data(), b.cu_seqlens.data(), b.ndocs(), ashape, A.sel, pick.data(), int(pick.size()),
                 got.data());
  for (float r : got) st.gating[size_t(l)].true_rows += 1, st.gating[size_t(l)].true_recall_sum += r;
}

template <class T>
MicroBatchStats Model<T>::run(const PackedBatch& b, const AttnSettings& a, T loss_scale, bool backward,
                              std::vector<int32_t>* argmax, const PartExchange<T>* ex,
                              const std::function<void(int)>& layer_done) {
  const auto t_start = Clock::now();
  const ModelDims& s = shape_;
  const int N = b.n(), C = s.d_model, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, F = s.ffn_dim,
            V = s.vocab, L = s.n_layers;
  const int HD = H * D, KD = Hkv * D, nd = b.ndocs();
  check_inputs(b, a, s);
  training_ = backward;
  if (!b.parts.empty() && !ex) throw std::logic_error("Model: a batch with documents in parts needs their exchange");
  const int n_seq = b.cu_seqlens.empty() ? 0 : b.cu_seqlens.back();  // rows of the whole sequences
  const k::AttnShape ashape{H, Hkv, D, a.block_size};
  MicroBatchStats st;
  st.gating.resize(L);

  std::vector<T> x(size_t(N) * C);  // (N, C) residual stream
  k::embedding_fwd(b.tokens.data(), W(base_layout_.embed), x.data(), N, C);

  std::vector<Layer> acts(L);
  for (int l = 0; l < L; ++l) {
    layer_forward(l, b, a, x, acts[l], true, st, ex);
    if (exec_.recompute) {  // keep the layer's input and block selection; the backward recomputes the rest
      Layer keep;
      keep.x_in = std::move(acts[l].x_in);
      keep.sel = std::move(acts[l].sel);
      acts[l] = std::move(keep);
    }
  }
  std::vector<T> xf(size_t(N) * C), rstdf(N);  // (N, C), (N)
  k::rmsnorm_fwd(x.data(), W(base_layout_.norm), xf.data(), rstdf.data(), N, C, s.norm_eps);
  // LM head and loss, chunked (never the whole (N, V) logits); its backward runs here, fused:
  // dxf (N, C) and the head's gradient.
  std::vector<uint8_t> correct(N, 0);
  std::vector<T> dxf(backward ? size_t(N) * C : 0);
  if (argmax) argmax->assign(N, 0);
  st.loss_sum = k::lm_head_loss(xf.data(), W(base_layout_.head), b.targets.data(), N, C, V, exec_.head_rows(N, V), loss_scale,
                                backward ? dxf.data() : nullptr, backward ? G(base_layout_.head) : nullptr, correct.data(),
                                argmax ? argmax->data() : nullptr);
  for (int t = 0; t < N; ++t) st.targets += b.targets[t] >= 0, st.correct += correct[t];
  if (!backward) {
    st.total_ms = ms_since(t_start);
    return st;
  }

  // ---- backward: the same path in reverse; dx is the gradient of the residual stream ----
  std::vector<T> dx(size_t(N) * C, T(0));
  k::rmsnorm_bwd(x.data(), W(base_layout_.norm), rstdf.data(), dxf.data(), dx.data(), G(base_layout_.norm), N, C);
  std::vector<T> dh(size_t(N) * F), dg(size_t(N) * F), du(size_t(N) * F), dxn(size_t(N) * C);
  std::vector<T> datt(size_t(N) * HD), dq(size_t(N) * HD), dk(size_t(N) * KD), dv(size_t(N) * KD);
  for (int l = L - 1; l >= 0; --l) {
    Layer& A = acts[l];
    if (exec_.recompute) {  // the layer's activations again, from its input and selection
      std::vector<T> xr = A.x_in;
      layer_forward(l, b, a, xr, A, false, st, ex);
    }
    const LayerParams& I = base_layout_.layers[size_t(l)];
    // MLP block: x_out = x_mid + down(swiglu(gate(xn2), up(xn2)))
    std::fill(dh.begin(), dh.end(), T(0));
    proj_bwd(l, 6, A.h.data(), dx.data(), dh.data(), N, F, C, A.u[6]);
    k::swiglu_bwd(A.gate.data(), A.up.data(), dh.data(), dg.data(), du.data(), size_t(N) * F);
    std::fill(dxn.begin(), dxn.end(), T(0));
    proj_bwd(l, 4, A.xn2.data(), dg.data(), dxn.data(), N, C, F, A.u[4]);
    proj_bwd(l, 5, A.xn2.data(), du.data(), dxn.data(), N, C, F, A.u[5]);
    k::rmsnorm_bwd(A.x_mid.data(), W(I.ln2), A.rstd2.data(), dxn.data(), dx.data(), G(I.ln2), N, C);
    // attention block: x_mid = x_in + o(attn(rope(q(xn)), rope(k(xn)), v(xn)))
    std::fill(datt.begin(), datt.end(), T(0));
    proj_bwd(l, 3, A.att.data(), dx.data(), datt.data(), N, HD, C, A.u[3]);
    auto ta = Clock::now();
    k::block_attention_bwd(A.q.data(), A.kk.data(), A.v.data(), A.att.data(), A.lse.data(), datt.data(),
                           b.cu_seqlens.data(), nd, ashape, A.sel, dq.data(), dk.data(), dv.data());
    for (size_t i = 0, at = size_t(n_seq); i < b.parts.size(); at += size_t(b.parts[i++].local_tokens()))
      part_attention_bwd(b.parts[i], *ex, A.q.data() + at * HD, A.kk.data() + at * KD, A.v.data() + at * KD,
                          A.att.data() + at * HD, A.lse.data() + at * H, datt.data() + at * HD, ashape,
                          A.part_sel[i], dq.data() + at * HD, dk.data() + at * KD, dv.data() + at * KD);
    st.attn_ms += ms_since(ta);
    k::rope_bwd(dq.data(), b.pos.data(), N, H, D, freqs());
    k::rope_bwd(dk.data(), b.pos.data(), N, Hkv, D, freqs());
    if (s.qk_norm) {  // through the per-head norms: dq, dk become the gradients of the projections' outputs
      std::vector<T> dr(dq.size(), T(0));
      k::rmsnorm_bwd(A.q_raw.data(), W(I.q_norm), A.rstdq.data(), dq.data(), dr.data(), G(I.q_norm), N * H, D);
      dq.swap(dr);
      dr.assign(dk.size(), T(0));
      k::rmsnorm_bwd(A.k_raw.data(), W(I.k_norm), A.rstdk.data(), dk.data(), dr.data(), G(I.k_norm), N * Hkv, D);
      dk.swap(dr);
    }
    if (s.qkv_bias && G(I.q_bias)) {  // the biases act before RoPE, so they take the un-rotated gradients
      k::bias_add_bwd(dq.data(), G(I.q_bias), N, HD);
      k::bias_add_bwd(dk.data(), G(I.k_bias), N, KD);
      k::bias_add_bwd(dv.data(), G(I.v_bias), N, KD);
    }
    std::fill(dxn.begin(), dxn.end(), T(0));
    proj_bwd(l, 0, A.xn.data(), dq.data(), dxn.data(), N, C, HD, A.u[0]);
    proj_bwd(l, 1, A.xn.data(), dk.data(), dxn.data(), N, C, KD, A.u[1]);
    proj_bwd(l, 2, A.xn.data(), dv.data(), dxn.data(), N, C, KD, A.u[2]);
    k::rmsnorm_bwd(A.x_in.data(), W(I.ln1), A.rstd1.data(), dxn.data(), dx.data(), G(I.ln1), N, C);
    A = Layer{};  // free this layer's activations early
    if (layer_done) layer_done(l);
  }
  if (T* ge = G(base_layout_.embed)) k::embedding_bwd(b.tokens.data(), dx.data(), ge, N, C);
  st.total_ms = ms_since(t_start);
  return st;
}

template class Model<float>;
template class Model<double>;

}  // namespace sb
