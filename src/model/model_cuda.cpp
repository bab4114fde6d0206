#include "src/model/model_cuda.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>

#include "base/cuda_check.hpp"
#include "base/error.hpp"

namespace sb {

namespace kc = kernels::cuda;
using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <class T>
DeviceArray<T>::~DeviceArray() {
  if (p_) cudaFree(p_);  // no check in a destructor
}

template <class T>
T* DeviceArray<T>::resize(size_t n) {
  if (n <= cap_ && p_) return p_;
  if (p_) SB_CUDA_CHECK(cudaFree(p_));
  p_ = nullptr, cap_ = 0;
  SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
  cap_ = std::max<size_t>(n, 1);
  return p_;
}

template class DeviceArray<float>;
template class DeviceArray<double>;
template class DeviceArray<kc::bf16>;
template class DeviceArray<int32_t>;
template class DeviceArray<unsigned char>;

// Activations of one layer saved for the backward pass (as Model<T>::Layer). Under
// train.recompute a layer keeps only x_in and its selection; the rest lives in the one work_ layer.
struct ModelCuda::Layer {
  DeviceArray<float> x_in, rstd1;      // (N, C), (N) residual stream entering the layer
  DeviceArray<kc::bf16> xn, q, k, v;   // (N, C), (N, H*D), (N, Hkv*D), (N, Hkv*D) after RoPE
  DeviceArray<kc::bf16> q_raw, k_raw;  // qk_norm: q, k before their norms (N*H, D), (N*Hkv, D)
  DeviceArray<float> rstdq, rstdk;     // qk_norm: (N*H), (N*Hkv)
  kc::DeviceSelection sel;
  const kc::DeviceSelection* selp = nullptr;  // &sel, or layer 0's (dense: every layer keeps the same blocks)
  DeviceArray<kc::bf16> att;           // (N, H*D)
  DeviceArray<float> lse;              // (N, H)
  DeviceArray<float> x_mid, rstd2;     // (N, C) after the attention residual, (N)
  DeviceArray<kc::bf16> xn2;           // (N, C)
  DeviceArray<kc::bf16> h;             // (N, F) swiglu(gate, up)
  DeviceArray<kc::bf16> gu;            // (N, 2F) gate|up, one GEMM's output
  DeviceArray<kc::bf16> u[kLoraTargets];  // LoRA: (N, rank) scale x A^T of each target with an adapter
  // data.long_docs = "split": each part's selection (this rank's rows) and the layer's statistics
  // of those rows, kept in layers_[l] for the backward and recomputation
  std::vector<std::unique_ptr<kc::DeviceSelection>> part_sel;
  kernels::GatingStats part_stats;
};

// Attention kernel times from CUDA events, read once at the end of the micro-batch.
struct ModelCuda::Timers {
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pairs;
  size_t used = 0;
  cudaStream_t stream;
  explicit Timers(cudaStream_t s) : stream(s) {}
  ~Timers() {
    for (auto& [a, b] : pairs) cudaEventDestroy(a), cudaEventDestroy(b);
  }
  size_t start() {
    if (used == pairs.size()) {
      cudaEvent_t a, b;
      SB_CUDA_CHECK(cudaEventCreate(&a));
      SB_CUDA_CHECK(cudaEventCreate(&b));
      pairs.push_back({a, b});
    }
    SB_CUDA_CHECK(cudaEventRecord(pairs[used].first, stream));
    return used++;
  }
  void stop(size_t i) { SB_CUDA_CHECK(cudaEventRecord(pairs[i].second, stream)); }
  double total_ms() {  // after the stream is synchronised
    double t = 0;
    for (size_t i = 0; i < used; ++i) {
      float ms = 0;
      SB_CUDA_CHECK(cudaEventElapsedTime(&ms, pairs[i].first, pairs[i].second));
      t += ms;
    }
    return t;
  }
};

ModelCuda::ModelCuda(const ModelDims& dims, const ParamLayout& base, const LoraSpec& lora, bool fp32_master)
    : dims_(dims), lora_(lora), base_layout_(base), master_(fp32_master) {
  if (base_layout_.layers.size() != size_t(dims_.n_layers) ||
      base_layout_.params[base_layout_.norm].name != "model.norm.weight")
    throw std::logic_error("ModelCuda: parameter layout does not match the model dims");
  LoraLayout ll = lora_layout(base_layout_, dims_, lora_);  // off: the base itself, each tensor trained
  layout_ = std::move(ll.train), of_base_ = std::move(ll.of_base), adapters_ = std::move(ll.adapters);
  n_ = layout_.size;
  SB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // Keep freed stream-ordered memory (gating's per-layer scratch) in the pool instead of returning
  // it to the driver at every synchronisation.
  int dev = 0;
  cudaMemPool_t pool;
  SB_CUDA_CHECK(cudaGetDevice(&dev));
  SB_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t keep = UINT64_MAX;
  SB_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  blas_ = std::make_unique<kc::Blas>(stream_);
  gating_ = std::make_unique<kc::DeviceGating>();
  off32_.assign(layout_.params.size(), kNoParam);
  const std::vector<size_t> f32 = fp32_read_params(base_layout_);  // what W() reads: the rest goes through W16()
  std::vector<char> train32(layout_.params.size(), 0);  // trainable tensors W() reads
  for (size_t i : f32)
    if (of_base_[i] != kNoParam) train32[of_base_[i]] = 1;
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    if (!master_ && !train32[i]) continue;
    off32_[i] = master_ ? layout_.params[i].offset : w32_size_;
    w32_size_ += layout_.params[i].size;
  }
  // LoRA: each frozen tensor once, in the precision the kernels read it (a frozen embedding: bf16)
  GpuFrozenCopies frozen = gpu_frozen_copies(base_layout_, of_base_);
  boff16_ = std::move(frozen.off16), boff32_ = std::move(frozen.off32);
  if (frozen.n16) base16_.resize(frozen.n16);
  if (frozen.n32) base32_.resize(frozen.n32);
  w32_.resize(w32_size_), g32_.resize(n_), w16_.resize(n_);
  // The layers read gate|up as one (2F, C) matrix and q|k|v as one (H*D + 2*Hkv*D, C): the layouts
  // (base and LoRA's frozen copies alike) keep gate and up adjacent, and q, k, v too unless their
  // biases sit between them (Qwen2)
  for (const LayerParams& I : base_layout_.layers) {
    auto next = [&](size_t a, size_t b) { return W16(b) == W16(a) + base_layout_.params[a].size; };
    if (!next(I.gate, I.up)) throw std::logic_error("ModelCuda: gate and up projections are not adjacent");
    qkv_adjacent_ = qkv_adjacent_ && next(I.q, I.k) && next(I.k, I.v);
  }
  frozen.off16 = boff16_;
  if (qkv_adjacent_ != gpu_qkv_adjacent(base_layout_, layout_, of_base_, frozen))  // the memory plan's view
    throw std::logic_error("ModelCuda: gpu_qkv_adjacent disagrees with the buffers");
  const RopeTable rt = rope_table(dims_.head_dim, dims_.rope_theta, dims_.rope_scaling);
  rope_scale_ = rt.scale;
  SB_CUDA_CHECK(cudaMemcpy(inv_freq_.resize(rt.inv_freq.size()), rt.inv_freq.data(), rt.inv_freq.size() * sizeof(double),
                           cudaMemcpyHostToDevice));
  zero_grads();
  for (int l = 0; l < dims_.n_layers; ++l) layers_.push_back(std::make_unique<Layer>());
  work_ = std::make_unique<Layer>();
}

template <class T>
static double held(const DeviceArray<T>& a) {
  return double(a.capacity()) * sizeof(T);
}

double ModelCuda::buffer_bytes() const {
  double b = 0;
  auto layer = [](const Layer& A) {
    double t = held(A.x_in) + held(A.rstd1) + held(A.xn) + held(A.q) + held(A.k) + held(A.v) + held(A.q_raw) +
               held(A.k_raw) + held(A.rstdq) + held(A.rstdk) + held(A.att) + held(A.lse) + held(A.x_mid) +
               held(A.rstd2) + held(A.xn2) + held(A.h) + held(A.gu);
    for (const auto& u : A.u) t += held(u);
    return t;
  };
  for (const auto& A : layers_) b += layer(*A);
  if (work_) b += layer(*work_);
  return b + held(tokens_) + held(targets_) + held(pos_) + held(argmax_) + held(xs_top_) + held(rstdf_) + held(loss_) +
         held(dxf_) + held(dx_) + held(dxn_) + held(xf_) + held(head16_) + held(dx16_) + held(dh_) + held(datt_) +
         held(dq_) + held(dk_) + held(dv_) + held(qkv_) + held(dqkv_) + held(dgu_) + held(attn_ws_) + held(du_) +
         held(xd_) + held(dxa_) + held(qkvw16_);
}

ModelCuda::~ModelCuda() {
  layers_.clear();
  work_.reset();
  blas_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void ModelCuda::upload_weights(const std::vector<float>& w) {
  if (w.size() != n_) throw std::logic_error("ModelCuda::upload_weights: size mismatch");
  if (!master_) {  // through a bounded device buffer: the bf16 copy and the fp32-read tensors
    DeviceArray<float> piece(std::min<size_t>(n_, size_t(1) << 24));
    for (size_t lo = 0; lo < n_; lo += piece.capacity()) {
      const size_t len = std::min(piece.capacity(), n_ - lo);
      SB_CUDA_CHECK(cudaMemcpyAsync(piece.data(), w.data() + lo, len * sizeof(float), cudaMemcpyHostToDevice, stream_));
      set_weights(piece.data(), lo, len);
    }
    SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  SB_CUDA_CHECK(cudaMemcpyAsync(w32_.data(), w.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, stream_));
  kc::to_bf16(w32_.data(), w16_.data(), n_, stream_);
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelCuda::set_weights(const float* piece, size_t lo, size_t len) {
  kc::to_bf16(piece, w16_.data() + lo, len, stream_);
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    const ParamInfo& p = layout_.params[i];
    const size_t b = std::max(p.offset, lo), e = std::min(p.offset + p.size, lo + len);
    if (off32_[i] == kNoParam || b >= e || (master_ && piece == w32_.data() + lo)) continue;
    SB_CUDA_CHECK(cudaMemcpyAsync(w32_.data() + off32_[i] + (b - p.offset), piece + (b - lo), (e - b) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream_));
  }
}

void ModelCuda::download_weights(std::vector<float>& w) const {
  if (!master_) throw std::logic_error("ModelCuda::download_weights: no fp32 master here (the engine keeps it)");
  w.resize(n_);
  SB_CUDA_CHECK(cudaMemcpyAsync(w.data(), w32_.data(), n_ * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// With q/k/v biases the layout puts each bias after its weight, so the packed (H*D + 2*Hkv*D, C)
// matrix of each layer is gathered from w16_ before every run: the engine's optimizer writes w16_
// between runs. 24 layers of the Qwen2.5-0.5B shape: 50 MB copied, about 0.03 ms.
void ModelCuda::pack_qkv_weights() {
  if (qkv_adjacent_) return;
  bf16* dst = qkvw16_.resize(sz_.qkv_weights);  // (L, H*D + 2*Hkv*D, C)
  for (const LayerParams& I : base_layout_.layers) {
    for (size_t i : {I.q, I.k, I.v}) {
      const size_t n = base_layout_.params[i].size;
      SB_CUDA_CHECK(cudaMemcpyAsync(dst, W16(i), n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
      dst += n;
    }
  }
}

const ModelCuda::bf16* ModelCuda::Wqkv(int l) {
  const size_t C = size_t(dims_.d_model), P3 = size_t(dims_.n_heads + 2 * dims_.n_kv_heads) * dims_.head_dim;
  return qkv_adjacent_ ? W16(base_layout_.layers[size_t(l)].q) : qkvw16_.data() + size_t(l) * P3 * C;
}

void ModelCuda::zero_grads() { SB_CUDA_CHECK(cudaMemsetAsync(g32_.data(), 0, n_ * sizeof(float), stream_)); }

template <class T>
static void to_device(DeviceArray<T>& d, const std::vector<T>& h, cudaStream_t s) {
  d.resize(h.size());
  SB_CUDA_CHECK(cudaMemcpyAsync(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}

// Forward of decoder layer l from its input layers_[l]->x_in (N, C) to x_out (N, C), the next
// layer's input (nullptr: not needed, as when recomputing for the backward). The activations the
// backward reads go to A: layers_[l] itself, or the one shared work_ layer under train.recompute.
// gate: select the blocks into layers_[l] (recomputation reuses them: no gating, no host sync).
// The residual adds go into the norms that follow them (kernels/cuda/fused.cu), so layer l leaves
// layer l+1's xn and rstd1 (or the final norm's xf_, rstdf_) computed; q|k|v and gate|up are one
// GEMM each, whose outputs the fused kernels read as column blocks (bias + RoPE, SwiGLU).
void ModelCuda::layer_forward(int l, const PackedBatch& b, const AttnSettings& a, Layer& A, float* x_out, bool gate,
                              MicroBatchStats& st, Timers& timers, Timers& gtimers) {
  const ModelDims& s = dims_;
  const int N = b.n(), C = s.d_model, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, F = s.ffn_dim;
  const int HD = H * D, KD = Hkv * D, nd = b.ndocs();
  const GpuLayerBuffers& z = sz_.layer;  // the buffers' sizes for this micro-batch (gpu_buffers.hpp)
  const kernels::AttnShape ashape = attn_shape(a);
  const float eps = float(s.norm_eps);
  cudaStream_t cs = stream_;
  kc::Blas& bl = *blas_;
  Layer& K = *layers_[l];  // what stays between forward and backward: x_in, the selection
  const float* x = K.x_in.data();
  const LayerParams& I = base_layout_.layers[size_t(l)];
  PhaseClock& ph = phases_;
  using P = Phase;
  // attention block
  ph.mark(P::elementwise, cs);
  if (!(x_out && l > 0))  // else layer l-1 computed it with its residual add
    kc::rmsnorm_fwd(x, W(I.ln1), A.xn.resize(z.xn), A.rstd1.resize(z.rstd1), N, C, eps, cs);
  ph.mark(P::gemm, cs);
  // q|k|v (N, HD + 2 KD) in one GEMM, then bias + RoPE into the arrays attention reads
  kc::linear_fwd(bl, A.xn.data(), Wqkv(l), qkv_.resize(sz_.qkv), N, C, HD + 2 * KD);
  for (int t = 0; t < 3; ++t) {  // LoRA on q, k, v: into their column blocks of qkv (N, HD + 2 KD)
    const int at = t == 0 ? 0 : t == 1 ? HD : HD + KD, out = t == 0 ? HD : KD;
    adapter_in(l, t, A.xn.data(), C, A.u[t], N);
    adapter_out(l, t, A.u[t].data(), qkv_.data() + at, HD + 2 * KD, out, N);
  }
  ph.mark(P::elementwise, cs);
  if (s.qk_norm) {  // Qwen3 (no biases): each head's q and k RMS-normed before RoPE, in the GEMM's output
    const int64_t P = HD + 2 * KD;
    kc::head_rmsnorm_fwd(qkv_.data(), P, W(I.q_norm), A.q_raw.resize(z.q_raw), A.rstdq.resize(z.rstdq), N,
                         H, D, eps, cs);
    kc::head_rmsnorm_fwd(qkv_.data() + HD, P, W(I.k_norm), A.k_raw.resize(z.k_raw),
                         A.rstdk.resize(z.rstdk), N, Hkv, D, eps, cs);
  }
  kc::qkv_rope_unpack_fwd(qkv_.data(), A.q.resize(z.q), A.k.resize(z.k),
                          A.v.resize(z.v), s.qkv_bias ? W(I.q_bias) : nullptr,
                          s.qkv_bias ? W(I.k_bias) : nullptr, s.qkv_bias ? W(I.v_bias) : nullptr, pos_.data(), N, H,
                          Hkv, D, rope(), cs);
  // Sparse: the kept blocks selected on the device (DeviceGating); a dense layer of a sparse run
  // (attention.dense_layers) keeps every causal block, one such selection per micro-batch shared by
  // those layers. Dense keeps every causal block in every layer: one selection per micro-batch, built
  // on the host at layer 0 (it synchronises).
  ph.mark(P::gating, cs);
  if (gate && !a.sparse && l > 0) {
    K.selp = layers_[0]->selp;
    st.gating[l] = st.gating[0];
  } else if (gate && a.sparse && !a.sparse_at(l)) {  // a dense layer of a sparse run: every causal block, built once a micro-batch
    if (!dense_sel_ready_) {
      kernels::BlockSelection sel;
      kernels::select_all_causal(b.cu_seqlens.data(), nd, ashape, sel);
      dense_sel_.upload(sel, b.cu_seqlens.data(), nd, ashape, cs);
      dense_sel_ready_ = true;
    }
    K.selp = &dense_sel_;
    st.gating[l] = kernels::all_causal_stats(b.cu_seqlens.data(), nd, ashape);
  } else if (gate && a.sparse && !probe_) {
    const size_t tg = gtimers.start();
    gating_->select(A.q.data(), A.k.data(), l, K.sel, cs);
    gtimers.stop(tg);
    K.selp = &K.sel;
  } else if (gate) {
    SB_CUDA_CHECK(cudaStreamSynchronize(cs));
    const auto tg = Clock::now();
    kernels::BlockSelection sel;
    if (a.sparse_at(l)) {  // the diagnostics' host selection (probe_: device gating is off)
      st.gating[l] = kc::gate_blocks(A.q.data(), A.k.data(), b.cu_seqlens.data(), nd, ashape, a.gating(l), sel, cs);
    } else {  // the stats in the gating's blocks, as the CPU engine and the latency model count them
      kernels::select_all_causal(b.cu_seqlens.data(), nd, ashape, sel);
      st.gating[l] = kernels::all_causal_stats(b.cu_seqlens.data(), nd, {H, Hkv, D, a.block_size});
    }
    if (probe_ && a.sparse_at(l)) {  // the diagnostics: float copies of q and k, the host selection
      auto host = [&](const kc::bf16* d, size_t n) {
        std::vector<kc::bf16> h(n);
        SB_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(kc::bf16), cudaMemcpyDeviceToHost, cs));
        SB_CUDA_CHECK(cudaStreamSynchronize(cs));
        std::vector<float> f(n);
        for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
        return f;
      };
      const std::vector<float> qh = host(A.q.data(), size_t(N) * HD), kh = host(A.k.data(), size_t(N) * KD);
      probe_(l, qh.data(), kh.data(), sel);
    }
    K.sel.upload(sel, b.cu_seqlens.data(), nd, ashape, cs);
    K.selp = &K.sel;
    st.gating_ms += ms_since(tg);
  }
  if (gate && a.sparse_at(l) && a.recall_rows > 0) {  // true recall of sampled rows (DST, balance.recall_rows)
    int64_t rows = 0;
    for (int d = 0; d < nd; ++d) rows += int64_t(Hkv) * ((b.cu_seqlens[d + 1] - b.cu_seqlens[d] + a.block_size - 1) / a.block_size);
    const std::vector<int64_t> pick = recall_sample(rows, a.recall_rows, l, N);
    std::vector<float> got(pick.size());
    kc::true_recall(A.q.data(), A.k.data(), b.cu_seqlens.data(), nd, ashape, *K.selp, pick.data(), int(pick.size()),
                    got.data(), cs);
    for (float r : got) st.gating[size_t(l)].true_rows += 1, st.gating[size_t(l)].true_recall_sum += r;
  }
  ph.mark(P::attn_fwd, cs);
  const size_t ta = timers.start();
  kc::block_attention_fwd(A.q.data(), A.k.data(), A.v.data(), *K.selp, ashape, A.att.resize(z.att),
                          A.lse.resize(z.lse), cs);
  if (!b.parts.empty()) parts_forward(l, b, a, A, gate);  // their gating and exchange count as attention
  timers.stop(ta);
  // x_mid = x_in + o(att): the GEMM writes o(att) and the norm's kernel adds x_in
  ph.mark(P::gemm, cs);
  float* xm = A.x_mid.resize(z.x_mid);
  kc::gemm(bl, false, true, N, C, HD, 1.f, A.att.data(), HD, W16(I.o), HD, 0.f, xm, C);
  adapter_in(l, 3, A.att.data(), HD, A.u[3], N);  // LoRA on o
  adapter_out(l, 3, A.u[3].data(), xm, C, C, N);
  // MLP block
  ph.mark(P::elementwise, cs);
  kc::add_rmsnorm_fwd(xm, x, W(I.ln2), A.xn2.resize(z.xn2), A.rstd2.resize(z.rstd2), N, C, eps, cs);
  ph.mark(P::gemm, cs);
  // gate|up (N, 2F): the two weights are adjacent, one (2F, C) matrix
  kc::linear_fwd(bl, A.xn2.data(), W16(I.gate), A.gu.resize(z.gu), N, C, 2 * F);
  for (int t = 4; t < 6; ++t) {  // LoRA on gate, up: their column blocks of gu (N, 2F)
    adapter_in(l, t, A.xn2.data(), C, A.u[t], N);
    adapter_out(l, t, A.u[t].data(), A.gu.data() + (t - 4) * F, 2 * F, F, N);
  }
  ph.mark(P::elementwise, cs);
  kc::swiglu_fwd_packed(A.gu.data(), A.h.resize(z.h), N, F, cs);
  ph.mark(P::gemm, cs);
  adapter_in(l, 6, A.h.data(), F, A.u[6], N);  // LoRA on down: u also when recomputing (x_out unused)
  if (!x_out) return;
  // x_out = x_mid + down(h), added by the next norm's kernel: layer l+1's ln1 into its activations
  // (the work_ layer under train.recompute), or the final norm after the last layer
  kc::gemm(bl, false, true, N, C, F, 1.f, A.h.data(), F, W16(I.down), F, 0.f, x_out, C);
  adapter_out(l, 6, A.u[6].data(), x_out, C, C, N);
  ph.mark(P::elementwise, cs);
  if (l + 1 < s.n_layers) {
    Layer& B = exec_.recompute ? *work_ : *layers_[l + 1];
    kc::add_rmsnorm_fwd(x_out, xm, W(base_layout_.layers[size_t(l) + 1].ln1), B.xn.resize(z.xn), B.rstd1.resize(z.rstd1), N, C,
                        eps, cs);
  } else {
    kc::add_rmsnorm_fwd(x_out, xm, W(base_layout_.norm), xf_.resize(sz_.xf), rstdf_.resize(sz_.rstdf), N, C, eps, cs);
  }
}

kernels::AttnShape ModelCuda::attn_shape(const AttnSettings& a) const {
  kernels::AttnShape s{dims_.n_heads, dims_.n_kv_heads, dims_.head_dim, a.block_size};
  if (!a.sparse) s.block_size = kc::dense_block_size(s);
  return s;
}

// A split document's rows attend through the exchange; gate = false (recomputation) reuses the
// selections but exchanges K and V again, as every member of the group recomputes the same layers.
void ModelCuda::parts_forward(int l, const PackedBatch& b, const AttnSettings& a, Layer& A, bool gate) {
  const ModelDims& s = dims_;
  const int H = s.n_heads, HD = H * s.head_dim, KD = s.n_kv_heads * s.head_dim;
  const kernels::AttnShape ashape{H, s.n_kv_heads, s.head_dim, a.block_size};
  if (!part_ex_) throw std::logic_error("ModelCuda: a batch with documents in parts needs their exchange");
  if (!part_ws_) part_ws_ = std::make_unique<PartScratchCuda>();
  Layer& K = *layers_[l];
  if (gate) K.part_sel.resize(b.parts.size()), K.part_stats = {};
  for (size_t i = 0, at = size_t(b.cu_seqlens.back()); i < b.parts.size(); at += size_t(b.parts[i++].local_tokens())) {
    if (!K.part_sel[i]) K.part_sel[i] = std::make_unique<kc::DeviceSelection>();
    const kernels::GatingStats g = part_attention_fwd_cuda(
        b.parts[i], *part_ex_, A.q.data() + at * HD, A.k.data() + at * KD, A.v.data() + at * KD, ashape,
        a.sparse_at(l), a.gating(l), gate, *K.part_sel[i], A.att.data() + at * HD,
        A.lse.data() + at * H, *part_ws_, stream_);
    if (gate) {
      kernels::GatingStats& t = K.part_stats;
      t.rows += g.rows, t.kept_blocks += g.kept_blocks, t.causal_blocks += g.causal_blocks, t.recall_sum += g.recall_sum;
    }
  }
}

void ModelCuda::parts_backward(int l, const PackedBatch& b, const AttnSettings& a, const Layer& A, const bf16* datt,
                                bf16* dq, bf16* dk, bf16* dv) {
  const ModelDims& s = dims_;
  const int H = s.n_heads, HD = H * s.head_dim, KD = s.n_kv_heads * s.head_dim;
  const kernels::AttnShape ashape{H, s.n_kv_heads, s.head_dim, a.block_size};
  const Layer& K = *layers_[l];
  for (size_t i = 0, at = size_t(b.cu_seqlens.back()); i < b.parts.size(); at += size_t(b.parts[i++].local_tokens()))
    part_attention_bwd_cuda(b.parts[i], *part_ex_, A.q.data() + at * HD, A.k.data() + at * KD, A.v.data() + at * KD,
                             A.att.data() + at * HD, A.lse.data() + at * H, datt + at * HD, ashape, *K.part_sel[i],
                             dq + at * HD, dk + at * KD, dv + at * KD, *part_ws_, stream_);
}

MicroBatchStats ModelCuda::run(const PackedBatch& b, const AttnSettings& a, float loss_scale, bool backward,
                               std::vector<int32_t>* argmax, const std::function<void(int)>& layer_done,
                               const PartExchangeCuda* ex) {
  const auto t_start = Clock::now();
  const ModelDims& s = dims_;
  const int N = b.n(), C = s.d_model, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, F = s.ffn_dim,
            V = s.vocab, L = s.n_layers;
  const int HD = H * D, KD = Hkv * D;
  const size_t NC = size_t(N) * C;
  check_inputs(b, a, s);
  // every buffer's size for N tokens, from the function the memory plan counts with
  sz_ = gpu_buffers(dims_, exec_, lora_, N, qkv_adjacent_);
  part_ex_ = ex;
  training_ = backward;
  dense_sel_ready_ = false;
  MicroBatchStats st;
  st.gating.resize(L);
  if (N == 0) return st;
  const kernels::AttnShape ashape = attn_shape(a);
  const float eps = float(s.norm_eps);
  cudaStream_t cs = stream_;
  kc::Blas& bl = *blas_;
  Timers timers(cs), gtimers(cs);
  PhaseClock& ph = phases_;
  using P = Phase;
  // Sparse gating on the device (select_device.cu): budgets and buffers once per micro-batch, then
  // no host round trip per layer (the host-built lists, one sync a layer, took 1.37x its time:
  // bench/results/2026-12-01-device-selection.md). The diagnostics (probe_) read a host selection.
  const bool dev_sel = a.sparse && !probe_;
  if (dev_sel) {
    gating_->prepare(b.cu_seqlens.data(), b.ndocs(), ashape, a.k, a.gating(-1), cs);
    for (auto& A : layers_) gating_->reserve(A->sel);
  }
  ph.mark(P::elementwise, cs);
  pack_qkv_weights();
  to_device(tokens_, b.tokens, cs);
  to_device(targets_, b.targets, cs);
  to_device(pos_, b.pos, cs);

  // ---- forward
  float* x = layers_.empty() ? xs_top_.resize(sz_.xs_top) : layers_[0]->x_in.resize(sz_.layer.x_in);  // (N, C)
  const size_t E = base_layout_.embed;
  if (of_base_[E] != kNoParam) kc::embedding_fwd(tokens_.data(), W(E), x, N, C, cs);
  else kc::embedding_fwd(tokens_.data(), W16(E), x, N, C, cs);  // LoRA: the frozen embedding's bf16 copy
  for (int l = 0; l < L; ++l) {
    float* xo = l + 1 < L ? layers_[l + 1]->x_in.resize(sz_.layer.x_in) : xs_top_.resize(sz_.xs_top);  // the next layer's input
    layer_forward(l, b, a, exec_.recompute ? *work_ : *layers_[l], xo, true, st, timers, gtimers);
    x = xo;
  }
  // x is the last layer's output (xs_top_)
  if (dev_sel) gating_->fetch_stats(cs);
  ph.mark(P::head_loss, cs);
  if (L == 0)  // else the last layer computed it with its residual add
    kc::rmsnorm_fwd(x, W(base_layout_.norm), xf_.resize(sz_.xf), rstdf_.resize(sz_.rstdf), N, C, eps, cs);
  // LM head and loss in chunks of `rows` tokens, never the whole (N, V) logits: logits (rows, V)
  // bf16, overwritten by dlogits (cross_entropy_inplace), reused by every chunk, and the head's
  // backward runs per chunk (fused): dxf (N, C) = dlogits W, the head's gradient += dlogits^T xf.
  // (fp32 logits with a second bf16 buffer for dlogits took 1.20x the LM head's time:
  // bench/results/2026-12-02-lm-head-streamed.md.)
  const int rows = sz_.head_rows;  // exec_.head_rows of bf16 logits
  bf16* logits = head16_.resize(sz_.head);  // (rows, V), then dlogits over them
  float* dxf = backward ? dxf_.resize(sz_.dxf) : nullptr;
  loss_.resize(sz_.loss), argmax_.resize(sz_.tokens);
  for (int t0 = 0; t0 < N; t0 += rows) {
    const int n = std::min(rows, N - t0);
    const bf16* xc = xf_.data() + size_t(t0) * C;
    kc::linear_fwd(bl, xc, W16(base_layout_.head), logits, n, C, V);
    kc::cross_entropy_inplace(logits, targets_.data() + t0, loss_.data() + t0, backward, argmax_.data() + t0, n, V,
                              loss_scale, cs);
    if (backward)
      kc::linear_bwd(bl, xc, W16(base_layout_.head), logits, dxf + size_t(t0) * C, false, G(base_layout_.head), n, C, V);
  }
  std::vector<float> loss(N);
  std::vector<int32_t> am(N);
  SB_CUDA_CHECK(cudaMemcpyAsync(loss.data(), loss_.data(), N * sizeof(float), cudaMemcpyDeviceToHost, cs));
  SB_CUDA_CHECK(cudaMemcpyAsync(am.data(), argmax_.data(), N * sizeof(int32_t), cudaMemcpyDeviceToHost, cs));

  if (backward) {
    // ---- backward: the same path in reverse; dx is the gradient of the residual stream (fp32)
    float* dx = dx_.resize(sz_.dx);
    float* dxn = dxn_.resize(sz_.dxn);
    bf16* dx16 = dx16_.resize(sz_.dx16);
    SB_CUDA_CHECK(cudaMemsetAsync(dx, 0, NC * sizeof(float), cs));
    ph.mark(P::head_loss, cs);
    // the norms' backward also write dx16 = bf16(dx), the input of the GEMM after them
    kc::rmsnorm_bwd_fused(xs_top_.data(), W(base_layout_.norm), rstdf_.data(), dxf, dx, dx16, G(base_layout_.norm), N, C, cs);
    const int P3 = HD + 2 * KD;  // packed q|k|v columns
    bf16* dh = dh_.resize(sz_.dh);
    bf16 *dgu = dgu_.resize(sz_.dgu), *dqkv = dqkv_.resize(sz_.dqkv);
    bf16 *datt = datt_.resize(sz_.datt), *dq = dq_.resize(sz_.dq);
    bf16 *dk = dk_.resize(sz_.dk), *dv = dv_.resize(sz_.dv);
    void* ws = attn_ws_.resize(sz_.attn_ws);  // kc::block_attention_bwd_workspace(N, ashape)
    for (int l = L - 1; l >= 0; --l) {
      Layer& K = *layers_[l];  // x_in and the selection
      Layer& A = exec_.recompute ? *work_ : K;
      if (exec_.recompute) layer_forward(l, b, a, A, nullptr, false, st, timers, gtimers);  // the activations again
      const LayerParams& I = base_layout_.layers[size_t(l)];
      // MLP block: x_out = x_mid + down(swiglu(gate(xn2), up(xn2)))
      ph.mark(P::gemm, cs);
      kc::linear_bwd(bl, A.h.data(), W16(I.down), dx16, dh, false, G(I.down), N, F, C);
      adapter_bwd(l, 6, A.h.data(), F, dx16, C, C, A.u[6].data(), dh, N);  // LoRA: dA, dB, dh += du A
      ph.mark(P::elementwise, cs);
      kc::swiglu_bwd_packed(A.gu.data(), dh, dgu, N, F, cs);
      ph.mark(P::gemm, cs);
      // dxn = dgu Wgu, the gate and up gradients (adjacent) += dgu^T xn2: two GEMMs, not four
      kc::linear_bwd(bl, A.xn2.data(), W16(I.gate), dgu, dxn, false, G(I.gate), N, C, 2 * F);
      for (int t = 4; t < 6; ++t) adapter_bwd(l, t, A.xn2.data(), C, dgu + (t - 4) * F, 2 * F, F, A.u[t].data(), dxn, N);
      ph.mark(P::elementwise, cs);
      kc::rmsnorm_bwd_fused(A.x_mid.data(), W(I.ln2), A.rstd2.data(), dxn, dx, dx16, G(I.ln2), N, C, cs);
      // attention block: x_mid = x_in + o(attn(rope(q(xn)), rope(k(xn)), v(xn)))
      ph.mark(P::gemm, cs);
      kc::linear_bwd(bl, A.att.data(), W16(I.o), dx16, datt, false, G(I.o), N, HD, C);
      adapter_bwd(l, 3, A.att.data(), HD, dx16, C, C, A.u[3].data(), datt, N);
      ph.mark(P::attn_bwd, cs);
      const size_t ta = timers.start();
      kc::block_attention_bwd(A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.lse.data(), datt, *K.selp, ashape,
                              dq, dk, dv, ws, cs);
      if (!b.parts.empty()) parts_backward(l, b, a, A, datt, dq, dk, dv);
      timers.stop(ta);
      ph.mark(P::elementwise, cs);
      kc::qkv_rope_pack_bwd(dq, dk, dv, dqkv, pos_.data(), N, H, Hkv, D, rope(), cs);
      if (s.qk_norm) {  // through the per-head norms, in place on dqkv's q and k column blocks
        kc::head_rmsnorm_bwd(dqkv, P3, A.q_raw.data(), W(I.q_norm), A.rstdq.data(), G(I.q_norm), N, H, D, cs);
        kc::head_rmsnorm_bwd(dqkv + HD, P3, A.k_raw.data(), W(I.k_norm), A.rstdk.data(), G(I.k_norm), N, Hkv, D, cs);
      }
      if (s.qkv_bias && G(I.q_bias)) {  // the column blocks of dqkv (LoRA: frozen biases, no gradient)
        kc::bias_add_bwd(dqkv, G(I.q_bias), N, HD, cs, P3);
        kc::bias_add_bwd(dqkv + HD, G(I.k_bias), N, KD, cs, P3);
        kc::bias_add_bwd(dqkv + HD + KD, G(I.v_bias), N, KD, cs, P3);
      }
      ph.mark(P::gemm, cs);
      if (qkv_adjacent_) {  // dxn = dqkv Wqkv; the q/k/v gradients, adjacent, += dqkv^T xn
        kc::linear_bwd(bl, A.xn.data(), W16(I.q), dqkv, dxn, false, G(I.q), N, C, P3);
      } else {  // biases between the weights: dW per column block of dqkv (LoRA: none, frozen)
        kc::linear_bwd(bl, A.xn.data(), Wqkv(l), dqkv, dxn, false, nullptr, N, C, P3);
        if (G(I.q)) kc::gemm(bl, true, false, HD, C, N, 1.f, dqkv, P3, A.xn.data(), C, 1.f, G(I.q), C);
        if (G(I.k)) kc::gemm(bl, true, false, KD, C, N, 1.f, dqkv + HD, P3, A.xn.data(), C, 1.f, G(I.k), C);
        if (G(I.v)) kc::gemm(bl, true, false, KD, C, N, 1.f, dqkv + HD + KD, P3, A.xn.data(), C, 1.f, G(I.v), C);
      }
      for (int t = 0; t < 3; ++t) {  // LoRA on q, k, v: dy is their column block of dqkv
        const int at = t == 0 ? 0 : t == 1 ? HD : HD + KD;
        adapter_bwd(l, t, A.xn.data(), C, dqkv + at, P3, t == 0 ? HD : KD, A.u[t].data(), dxn, N);
      }
      ph.mark(P::elementwise, cs);
      // dx16 feeds layer l-1's down projection (layer 0: the embedding reads dx)
      kc::rmsnorm_bwd_fused(K.x_in.data(), W(I.ln1), A.rstd1.data(), dxn, dx, l > 0 ? dx16 : nullptr, G(I.ln1), N, C,
                            cs);
      if (layer_done) layer_done(l);
    }
    ph.mark(P::elementwise, cs);
    if (float* ge = G(base_layout_.embed)) kc::embedding_bwd(tokens_.data(), dx, ge, N, C, cs);
  }
  ph.end(cs);
  SB_CUDA_CHECK(cudaStreamSynchronize(cs));
  ph.collect();
  if (dev_sel) {
    for (int l = 0; l < L; ++l)  // dense layers (attention.dense_layers) counted theirs in the forward
      if (a.sparse_at(l)) st.gating[l] = gating_->stats(l);
    st.gating_ms = gtimers.total_ms();
  }
  for (int l = 0; l < L && !b.parts.empty(); ++l) {  // the parts' rows, once per layer
    const kernels::GatingStats& g = layers_[l]->part_stats;
    st.gating[l].rows += g.rows, st.gating[l].kept_blocks += g.kept_blocks;
    st.gating[l].causal_blocks += g.causal_blocks, st.gating[l].recall_sum += g.recall_sum;
  }
  size_t mem_free = 0, mem_total = 0;
  SB_CUDA_CHECK(cudaMemGetInfo(&mem_free, &mem_total));
  mem_peak_ = std::max(mem_peak_, mem_total - mem_free);
  for (int t = 0; t < N; ++t) {
    if (b.targets[t] < 0) continue;
    st.loss_sum += double(loss[t]);
    st.targets += 1;
    st.correct += am[t] == b.targets[t];
  }
  if (argmax) *argmax = std::move(am);
  st.attn_ms = timers.total_ms();
  st.total_ms = ms_since(t_start);
  return st;
}

}  // namespace sb
