// LoRA on the CPU model (model.hpp "LoRA"): the trainable layout, the adapters' init, the
// projections with their low-rank path, and the merged weights of an export.
#include <cmath>
#include <random>

#include "base/error.hpp"
#include "kernels/lora_dropout.hpp"
#include "src/model/model.hpp"

namespace sb {

namespace k = kernels;

size_t target_param(const LayerParams& I, int t) {
  const size_t idx[kLoraTargets] = {I.q, I.k, I.v, I.o, I.gate, I.up, I.down};
  return idx[t];
}

LoraLayout lora_layout(const ParamLayout& base, const ModelDims& d, const LoraSpec& s) {
  LoraLayout out;
  const size_t nb = base.params.size();
  if (!s.on()) {  // every tensor trains: the base layout, each tensor its own
    out.train = base;
    for (size_t i = 0; i < nb; ++i) out.of_base.push_back(i);
    return out;
  }
  out.of_base.assign(nb, kNoParam);
  ParamLayout& L = out.train;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay) {
    size_t n = 1;
    for (auto x : shape) n *= size_t(x);
    L.params.push_back({std::move(name), std::move(shape), L.size, n, decay});
    L.size += n;
    return L.params.size() - 1;
  };
  auto copy = [&](size_t i) {  // a base tensor trained in full: same name, shape and decay
    const ParamInfo& p = base.params[i];
    return out.of_base[i] = add(p.name, p.shape, p.decay);
  };
  const bool tied = base.head == base.embed;
  if (s.embed || (s.head && tied)) L.embed = copy(base.embed);
  for (int l = 0; l < d.n_layers; ++l) {
    const LayerParams& I = base.layers[size_t(l)];
    std::array<LoraPair, kLoraTargets> ad{};
    auto adapter = [&](int t) {
      if (!s.targets[size_t(t)]) return;
      const ParamInfo& w = base.params[target_param(I, t)];  // (out, in)
      const std::string stem = w.name.substr(0, w.name.size() - std::string("weight").size());
      ad[size_t(t)].a = add(stem + "lora_A.weight", {s.rank, w.shape[1]}, true);
      ad[size_t(t)].b = add(stem + "lora_B.weight", {w.shape[0], s.rank}, true);
    };
    if (s.norm) copy(I.ln1);
    for (int t = 0; t < 4; ++t) adapter(t);
    if (s.norm && I.q_norm != kNoParam) copy(I.q_norm), copy(I.k_norm);
    if (s.norm) copy(I.ln2);
    for (int t = 4; t < kLoraTargets; ++t) adapter(t);
    out.adapters.push_back(ad);
  }
  if (s.norm) L.norm = copy(base.norm);
  if (s.head && !tied) L.head = copy(base.head);
  // L.layers stays empty: the adapters of a layer are not one range the reduction could start
  // early with the base's layer order (reduction_ranges then reduces the whole buffer at once).
  return out;
}

std::vector<size_t> fp32_read_params(const ParamLayout& base) {
  std::vector<size_t> f32 = {base.embed, base.norm};
  for (const LayerParams& I : base.layers)
    for (size_t i : {I.ln1, I.ln2, I.q_bias, I.k_bias, I.v_bias, I.q_norm, I.k_norm})
      if (i != kNoParam) f32.push_back(i);
  return f32;
}

template <class T>
void Model<T>::init_adapters(uint64_t seed) {
  // PEFT's reset_lora_parameters: kaiming_uniform_(A, a = sqrt(5)) is uniform(-b, b) with
  // b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + 5)): b = 1 / sqrt(in). B = 0, so the
  // adapted model starts as the base.
  std::mt19937_64 rng(seed ^ 0x4C6F5241AD0A7E55ull);  // "LoRA": its own stream, the base's unchanged
  auto uniform = [&] { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
  for (const auto& layer : adapters_)
    for (const LoraPair& ab : layer) {
      if (ab.a == kNoParam) continue;
      const ParamInfo& A = layout_.params[ab.a];
      const double bound = 1.0 / std::sqrt(double(A.shape[1]));
      for (size_t i = 0; i < A.size; ++i) w_[A.offset + i] = T(bound * (2 * uniform() - 1));
      const ParamInfo& B = layout_.params[ab.b];
      std::fill(w_.begin() + long(B.offset), w_.begin() + long(B.offset + B.size), T(0));
    }
  set_base(std::move(base_));
}

template <class T>
void Model<T>::set_base(std::vector<T> w, bool copy_train_also) {
  if (w.size() != base_layout_.size) throw std::logic_error("Model::set_base: size differs from the model's");
  if (!lora_.on()) {
    w_ = std::move(w);
    return;
  }
  base_ = std::move(w);
  if (!copy_train_also) return;
  for (size_t i = 0; i < of_base_.size(); ++i)
    if (const size_t t = of_base_[i]; t != kNoParam) {
      const ParamInfo &b = base_layout_.params[i], &p = layout_.params[t];
      std::copy(base_.begin() + long(b.offset), base_.begin() + long(b.offset + b.size), w_.begin() + long(p.offset));
    }
}

template <class T>
std::vector<T> Model<T>::merged() const {
  std::vector<T> m(base_layout_.size);
  for (size_t i = 0; i < base_layout_.params.size(); ++i) {  // the base, or the trained copy
    const ParamInfo& b = base_layout_.params[i];
    std::copy(W(i), W(i) + b.size, m.begin() + long(b.offset));
  }
  for (size_t l = 0; l < adapters_.size(); ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      const LoraPair& ab = adapters_[l][size_t(t)];
      if (ab.a == kNoParam) continue;
      const ParamInfo& w = base_layout_.params[target_param(base_layout_.layers[l], t)];
      const int out = int(w.shape[0]), in = int(w.shape[1]), r = lora_.rank;
      // W (out, in) += scale * B (out, r) @ A (r, in)
      k::gemm<T>(false, false, out, in, r, T(lora_.scale()), w_.data() + layout_.params[ab.b].offset, r,
                 w_.data() + layout_.params[ab.a].offset, in, T(1), m.data() + w.offset, in);
    }
  return m;
}

// lora.dropout in training: the adapter's input with the elements kernels::dropout_keep drops at
// zero and the rest scaled by 1 / (1 - p) (empty: no dropout, the adapter reads x itself).
template <class T>
static std::vector<T> dropped(const T* x, size_t n, const LoraSpec& s, bool training, uint64_t key) {
  if (!training || s.dropout <= 0) return {};
  const uint32_t thr = k::dropout_threshold(s.dropout);
  const T inv = T(1.0 / (1.0 - s.dropout));
  std::vector<T> xd(n);
  for (size_t i = 0; i < n; ++i) xd[i] = k::dropout_keep(key, i, thr) ? x[i] * inv : T(0);
  return xd;
}

template <class T>
void Model<T>::proj_fwd(int l, int t, const T* x, T* y, int N, int in, int out, std::vector<T>& u) {
  k::linear_fwd(x, W(target_param(base_layout_.layers[size_t(l)], t)), y, N, in, out);
  if (!lora_.on() || adapters_[size_t(l)][size_t(t)].a == kNoParam) return;
  const LoraPair& ab = adapters_[size_t(l)][size_t(t)];
  const int r = lora_.rank;
  const std::vector<T> xd = dropped(x, size_t(N) * in, lora_, training_, k::dropout_key(drop_key_, l, t));
  if (!xd.empty()) x = xd.data();
  u.assign(size_t(N) * r, T(0));
  // u (N, r) = scale * x (N, in) @ A^T;  y (N, out) += u @ B^T
  k::gemm<T>(false, true, N, r, in, T(lora_.scale()), x, in, w_.data() + layout_.params[ab.a].offset, in, T(0),
             u.data(), r);
  k::gemm<T>(false, true, N, out, r, T(1), u.data(), r, w_.data() + layout_.params[ab.b].offset, r, T(1), y, out);
}

template <class T>
void Model<T>::proj_bwd(int l, int t, const T* x, const T* dy, T* dx, int N, int in, int out, const std::vector<T>& u) {
  const size_t wi = target_param(base_layout_.layers[size_t(l)], t);
  k::linear_bwd(x, W(wi), dy, dx, G(wi), N, in, out);  // G: nullptr for a frozen W (no dW)
  if (!lora_.on() || adapters_[size_t(l)][size_t(t)].a == kNoParam) return;
  const LoraPair& ab = adapters_[size_t(l)][size_t(t)];
  const int r = lora_.rank;
  const T* B = w_.data() + layout_.params[ab.b].offset;
  const T* A = w_.data() + layout_.params[ab.a].offset;
  // dB (out, r) += dy^T @ u;  du (N, r) = scale * dy @ B;  dA (r, in) += du^T @ x;  dx += du @ A
  // (lora.dropout: x is the dropped input, drawn again with the forward's key, and du @ A goes
  // through the same mask and scale)
  const uint64_t key = k::dropout_key(drop_key_, l, t);
  const std::vector<T> xd = dropped(x, size_t(N) * in, lora_, training_, key);
  k::gemm<T>(true, false, out, r, N, T(1), dy, out, u.data(), r, T(1), g_.data() + layout_.params[ab.b].offset, r);
  std::vector<T> du(size_t(N) * r);
  k::gemm<T>(false, false, N, r, out, T(lora_.scale()), dy, out, B, r, T(0), du.data(), r);
  k::gemm<T>(true, false, r, in, N, T(1), du.data(), r, xd.empty() ? x : xd.data(), in, T(1),
             g_.data() + layout_.params[ab.a].offset, in);
  if (!dx) return;
  if (xd.empty()) return k::gemm<T>(false, false, N, in, r, T(1), du.data(), r, A, in, T(1), dx, in);
  std::vector<T> dxa(size_t(N) * in);  // du @ A, then masked and scaled into dx
  k::gemm<T>(false, false, N, in, r, T(1), du.data(), r, A, in, T(0), dxa.data(), in);
  const uint32_t thr = k::dropout_threshold(lora_.dropout);
  const T inv = T(1.0 / (1.0 - lora_.dropout));
  for (size_t i = 0; i < dxa.size(); ++i)
    if (k::dropout_keep(key, i, thr)) dx[i] += dxa[i] * inv;
}

// The members defined here (the class itself is instantiated in model.cpp).
#define SB_LORA_MEMBERS(T)                                                                                      \
  template void Model<T>::init_adapters(uint64_t);                                                              \
  template void Model<T>::set_base(std::vector<T>, bool);                                                             \
  template std::vector<T> Model<T>::merged() const;                                                             \
  template void Model<T>::proj_fwd(int, int, const T*, T*, int, int, int, std::vector<T>&);                     \
  template void Model<T>::proj_bwd(int, int, const T*, const T*, T*, int, int, int, const std::vector<T>&);
SB_LORA_MEMBERS(float)
SB_LORA_MEMBERS(double)
#undef SB_LORA_MEMBERS

}  // namespace sb
