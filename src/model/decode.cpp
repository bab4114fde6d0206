#include "src/model/decode.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

#include "base/error.hpp"

namespace sb {

namespace k = kernels;

template <class T>
Decoder<T>::Decoder(const Model<T>& model)
    : m_(model), rope_(rope_table(model.shape().head_dim, model.shape().rope_theta, model.shape().rope_scaling)),
      k_(size_t(model.shape().n_layers)), v_(size_t(model.shape().n_layers)) {}

// The same layer as Model<T>::layer_forward with dense attention, for n new rows whose keys and
// values join the cache: x (n, C) in place.
template <class T>
std::vector<T> Decoder<T>::append(std::span<const int32_t> tokens, int rows) {
  const ModelDims& s = m_.shape();
  const ParamLayout& P = m_.layout();
  const int n = int(tokens.size()), C = s.d_model, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim,
            F = s.ffn_dim, V = s.vocab, HD = H * D, KD = Hkv * D, group = H / Hkv;
  if (n == 0 || rows < 1 || rows > n) throw std::logic_error("Decoder::append: rows must be in 1..tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= V)
      throw Error("token id " + std::to_string(t) + " is outside the model's vocabulary (" + std::to_string(V) + ")");
  auto W = [&](size_t idx) { return m_.weights().data() + P.params[idx].offset; };
  const k::RopeFreqs freqs{rope_.inv_freq.data(), rope_.scale};
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), len_);
  std::vector<T> x(size_t(n) * C), xn(size_t(n) * C), r(size_t(n) * std::max(H, 1)), tmp(size_t(n) * C);
  std::vector<T> q(size_t(n) * HD), kk(size_t(n) * KD), v(size_t(n) * KD), att(size_t(n) * HD);
  std::vector<T> g(size_t(n) * F), u(size_t(n) * F), h(size_t(n) * F);
  k::embedding_fwd(tokens.data(), W(P.embed), x.data(), n, C);
  const double scale = 1.0 / std::sqrt(double(D));
  for (int l = 0; l < s.n_layers; ++l) {
    const LayerParams& I = P.layers[size_t(l)];
    k::rmsnorm_fwd(x.data(), W(I.ln1), xn.data(), r.data(), n, C, s.norm_eps);
    k::linear_fwd(xn.data(), W(I.q), q.data(), n, C, HD);
    k::linear_fwd(xn.data(), W(I.k), kk.data(), n, C, KD);
    k::linear_fwd(xn.data(), W(I.v), v.data(), n, C, KD);
    if (s.qkv_bias) {
      k::bias_add_fwd(q.data(), W(I.q_bias), n, HD);
      k::bias_add_fwd(kk.data(), W(I.k_bias), n, KD);
      k::bias_add_fwd(v.data(), W(I.v_bias), n, KD);
    }
    if (s.qk_norm) {  // in place is fine: rmsnorm_fwd reads a row before it writes it
      std::vector<T> raw = q, rq(size_t(n) * H);
      k::rmsnorm_fwd(raw.data(), W(I.q_norm), q.data(), rq.data(), n * H, D, s.norm_eps);
      raw = kk;
      k::rmsnorm_fwd(raw.data(), W(I.k_norm), kk.data(), rq.data(), n * Hkv, D, s.norm_eps);
    }
    k::rope_fwd(q.data(), pos.data(), n, H, D, freqs);
    k::rope_fwd(kk.data(), pos.data(), n, Hkv, D, freqs);
    std::vector<T>& Kc = k_[size_t(l)];  // (len_ + n, KD)
    std::vector<T>& Vc = v_[size_t(l)];
    Kc.insert(Kc.end(), kk.begin(), kk.end());
    Vc.insert(Vc.end(), v.begin(), v.end());
    // Causal attention of each new row over the cache (itself included); softmax in double.
    std::vector<double> p(static_cast<size_t>(len_ + n)), acc(static_cast<size_t>(D));
    for (int i = 0; i < n; ++i) {
      const int keys = len_ + i + 1;
      for (int hh = 0; hh < H; ++hh) {
        const T* qi = q.data() + size_t(i) * HD + size_t(hh) * D;
        const size_t off = size_t(hh / group) * D;
        double mx = -INFINITY;
        for (int j = 0; j < keys; ++j) {
          const T* kj = Kc.data() + size_t(j) * KD + off;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qi[d]) * double(kj[d]);
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j < keys; ++j) {
          const double e = std::exp(p[size_t(j)] - mx);
          sum += e;
          const T* vj = Vc.data() + size_t(j) * KD + off;
          for (int d = 0; d < D; ++d) acc[size_t(d)] += e * double(vj[d]);
        }
        T* out = att.data() + size_t(i) * HD + size_t(hh) * D;
        for (int d = 0; d < D; ++d) out[d] = T(acc[size_t(d)] / sum);
      }
    }
    k::linear_fwd(att.data(), W(I.o), tmp.data(), n, HD, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    k::rmsnorm_fwd(x.data(), W(I.ln2), xn.data(), r.data(), n, C, s.norm_eps);
    k::linear_fwd(xn.data(), W(I.gate), g.data(), n, C, F);
    k::linear_fwd(xn.data(), W(I.up), u.data(), n, C, F);
    k::swiglu_fwd(g.data(), u.data(), h.data(), size_t(n) * F);
    k::linear_fwd(h.data(), W(I.down), tmp.data(), n, F, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }
  len_ += n;
  k::rmsnorm_fwd(x.data(), W(P.norm), xn.data(), r.data(), n, C, s.norm_eps);
  std::vector<T> logits(size_t(rows) * V);  // (rows, V): the head over the last rows only
  k::linear_fwd(xn.data() + size_t(n - rows) * C, W(P.head), logits.data(), rows, C, V);
  return logits;
}

int32_t pick_token(std::span<const float> logits, double temperature, double top_p, double u) {
  const size_t V = logits.size();
  if (temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(V);
  double sum = 0;
  for (size_t i = 0; i < V; ++i) sum += p[i] = std::exp((double(logits[i]) - mx) / temperature);
  std::vector<int32_t> order(V);  // likeliest first; ties by id, so a draw is reproducible
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  size_t keep = 0;  // the nucleus: the fewest tokens whose mass reaches top_p (at least one)
  double mass = 0;
  while (keep < V && (keep == 0 || mass < top_p * sum)) mass += p[size_t(order[keep++])];
  double at = u * mass;
  for (size_t i = 0; i < keep; ++i)
    if ((at -= p[size_t(order[i])]) < 0) return order[i];
  return order[keep - 1];
}

Generated generate(const std::vector<int32_t>& prompt, const NextLogits& next, const GenerateOptions& o) {
  if (prompt.empty()) throw Error("generate: the prompt has no tokens");
  std::mt19937_64 rng(o.seed);
  Generated g;
  std::vector<int32_t> seq = prompt;
  int fresh = int(prompt.size());
  for (int t = 0; t < o.max_new; ++t) {
    const std::vector<float> logits = next(seq, fresh);
    const double u = double(rng() >> 11) * (1.0 / 9007199254740992.0);
    const int32_t id = pick_token(logits, o.temperature, o.top_p, u);
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (float z : logits) sum += std::exp(double(z) - mx);
    g.ids.push_back(id);
    g.logprobs.push_back(double(logits[size_t(id)]) - mx - std::log(sum));
    seq.push_back(id), fresh = 1;
    if (std::find(o.stop.begin(), o.stop.end(), id) != o.stop.end()) {
      g.stopped = true;
      break;
    }
  }
  return g;
}

template class Decoder<float>;
template class Decoder<double>;

}  // namespace sb
