#include "src/balance/latency_model.hpp"

#include <algorithm>
#include <cmath>

#include "io/h5.hpp"
#include "base/error.hpp"

namespace sb {

const char* part_name(Part p) {
  switch (p) {
    case Part::Attention: return "attention";
    case Part::Gating: return "gating";
    case Part::Linear: return "linear";
    case Part::AllReduce: return "allreduce";
  }
  return "?";
}

static int n_features(Part p) { return p == Part::Attention || p == Part::Gating ? 3 : 2; }

LatencyModel::LatencyModel(ModelShape shape) : shape_(shape), sparse_layers_(shape.n_layers) {
  if (shape.n_layers < 1 || shape.block_size < 1 || shape.local_blocks < 0)
    throw Error("latency model: invalid shape (n_layers " + std::to_string(shape.n_layers) + ", block_size " +
                std::to_string(shape.block_size) + ", local_blocks " + std::to_string(shape.local_blocks) + ")");
  p_.n_layers = shape.n_layers, p_.block_size = shape.block_size, p_.local_blocks = shape.local_blocks;
  // Analytic defaults, ms (a 7B-class layer on one H200, block-sparse kernels at ~25% of peak):
  // attention 0.56 ns per kept (query, key) pair fwd+bwd, token-linear work 2.5 us per token per
  // layer fwd+bwd, a small launch constant per part. Replace with `sparsebalance profile`.
  p_.coeffs[int(Part::Attention)] = {0.02, 1.0e-5, 5.6e-7};
  p_.coeffs[int(Part::Gating)] = {0.01, 1.0e-5, 1.0e-5};
  p_.coeffs[int(Part::Linear)] = {2.0, 2.5e-3 * shape.n_layers, 0};
  p_.coeffs[int(Part::AllReduce)] = {0.05, 1.0e-8, 0};  // ~100 GB/s bus bandwidth
}

LatencyModel LatencyModel::from_profile(const LatencyProfile& p) {
  LatencyModel m(ModelShape{int(p.n_layers), int(p.block_size), int(p.local_blocks)});
  m.p_ = p;
  return m;
}

void LatencyModel::set_dense_layers(std::vector<uint8_t> dense) {
  if (!dense.empty() && int(dense.size()) != shape_.n_layers)
    throw Error("latency model: " + std::to_string(dense.size()) + " dense-layer flags for " +
                std::to_string(shape_.n_layers) + " layers");
  dense_ = std::move(dense);
  sparse_layers_ = shape_.n_layers;
  for (uint8_t d : dense_) sparse_layers_ -= d ? 1 : 0;
}

double LatencyModel::causal_blocks(int64_t len, int block_size) {
  double nb = double((len + block_size - 1) / block_size);
  return nb * (nb + 1) / 2;
}

double LatencyModel::anchor_blocks(int64_t len) const {
  // Row i keeps {0} U [i-w, i]: min(i+1, w+2) blocks.
  int64_t nb = (len + shape_.block_size - 1) / shape_.block_size;
  int64_t m = shape_.local_blocks + 2, t = std::min(nb, m);
  return double(t) * double(t + 1) / 2 + double(nb - t) * double(m);
}

double LatencyModel::kept_blocks(int64_t len, int k) const {
  int64_t nb = (len + shape_.block_size - 1) / shape_.block_size;
  // Row i has max(0, i-w-1) candidates besides the anchors; it keeps min(k, that) of them.
  int64_t U = std::max<int64_t>(0, nb - shape_.local_blocks - 2), kk = std::max(k, 0);
  double cand = U <= kk ? double(U) * double(U + 1) / 2 : double(kk) * double(kk + 1) / 2 + double(U - kk) * double(kk);
  return anchor_blocks(len) + p_.density * cand;
}

double LatencyModel::part_ms(Part part, double tokens, double x2) const {
  const auto& c = p_.coeffs[int(part)];
  return (c[0] + c[1] * tokens + c[2] * x2) * p_.correction[int(part)];
}

PartTimes LatencyModel::micro_batch_parts(const MicroBatch& mb, std::span<const int> k_per_layer) const {
  if (int(k_per_layer.size()) != shape_.n_layers)
    throw Error("latency model: " + std::to_string(k_per_layer.size()) + " budgets given for " +
                std::to_string(shape_.n_layers) + " layers");
  PartTimes t;
  double tokens = double(mb.tokens), pairs = 0, bs2 = double(shape_.block_size) * shape_.block_size;
  for (const auto& s : mb.segs) pairs += causal_blocks(int64_t(s.len), shape_.block_size);
  double attn_l = 0;
  for (int l = 0, prev = -1; l < shape_.n_layers; ++l) {
    const int k = dense_at(l) ? -1 : k_per_layer[l];  // -1: a dense layer, every causal block
    if (l == 0 || k != prev) {  // same budget as the layer before: same time
      double kept = 0;
      for (const auto& s : mb.segs) kept += k < 0 ? causal_blocks(int64_t(s.len), shape_.block_size) : kept_blocks(int64_t(s.len), k);
      attn_l = part_ms(Part::Attention, tokens, kept * bs2);
    }
    t.attention += attn_l, prev = k;
  }
  t.gating = sparse_layers_ * part_ms(Part::Gating, tokens, pairs);
  t.linear = part_ms(Part::Linear, tokens);
  return t;
}

double LatencyModel::part_gating_ms(const MicroBatch& part, int64_t doc_len) const {
  if (part_gating_ == PartGating::Whole)
    return sparse_layers_ * part_ms(Part::Gating, double(doc_len), causal_blocks(doc_len, shape_.block_size));
  double pairs = 0;
  for (const auto& s : part.segs) pairs += causal_blocks(int64_t(s.begin), int64_t(s.begin + s.len), shape_.block_size);
  return sparse_layers_ * part_ms(Part::Gating, double(part.tokens), pairs);
}

double LatencyModel::micro_batch_ms(const MicroBatch& mb, std::span<const int> k_per_layer) const {
  return micro_batch_parts(mb, k_per_layer).total();
}

double LatencyModel::micro_batch_ms(const MicroBatch& mb, int k) const {
  std::vector<int> ks(size_t(shape_.n_layers), k);
  return micro_batch_ms(mb, ks);
}

double LatencyModel::layer_ms(int64_t tokens, double kept, double pairs) const {
  double bs2 = double(shape_.block_size) * shape_.block_size;
  return part_ms(Part::Attention, double(tokens), kept * bs2) + part_ms(Part::Gating, double(tokens), pairs);
}

// n_gated layers keeping `kept` blocks and gating, n_dense layers keeping every causal block.
static double segment_cost_kept(const LatencyProfile& p, const ModelShape& s, int64_t len, double kept, int n_gated,
                                int n_dense) {
  const auto& a = p.coeffs[int(Part::Attention)];
  const auto& g = p.coeffs[int(Part::Gating)];
  const auto& l = p.coeffs[int(Part::Linear)];
  const double L = double(len), bs2 = double(s.block_size) * s.block_size, causal = LatencyModel::causal_blocks(len, s.block_size);
  auto attn = [&](double blocks) { return (a[1] * L + a[2] * blocks * bs2) * p.correction[int(Part::Attention)]; };
  double gate = (g[1] * L + g[2] * causal) * p.correction[int(Part::Gating)];
  return n_gated * (attn(kept) + gate) + n_dense * attn(causal) + l[1] * L * p.correction[int(Part::Linear)];
}

double LatencyModel::segment_cost(int64_t len, int k) const {
  return segment_cost_kept(p_, shape_, len, kept_blocks(len, k), sparse_layers_, shape_.n_layers - sparse_layers_);
}

double LatencyModel::dense_segment_cost(int64_t len) const {
  return segment_cost_kept(p_, shape_, len, causal_blocks(len, shape_.block_size), shape_.n_layers, 0);
}

// Least squares over the features named by the bits of `use` (feature j: 1, tokens, x2; j < nf), the
// others 0: the normal equations with column scaling (features span many decades).
static std::array<double, 3> least_squares(std::span<const LatencySample> s, const std::vector<size_t>& idx, int nf,
                                           unsigned use) {
  auto feat = [&](const LatencySample& x, int j) { return j == 0 ? 1.0 : j == 1 ? x.tokens : x.x2; };
  int fj[3], m = 0;
  for (int j = 0; j < nf; ++j)
    if (use >> j & 1u) fj[m++] = j;
  double scale[3] = {1, 1, 1};
  for (size_t i : idx)
    for (int r = 0; r < m; ++r) scale[r] = std::max(scale[r], std::abs(feat(s[i], fj[r])));
  double A[3][4] = {};
  for (size_t i : idx)
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < m; ++c) A[r][c] += feat(s[i], fj[r]) / scale[r] * feat(s[i], fj[c]) / scale[c];
      A[r][m] += feat(s[i], fj[r]) / scale[r] * s[i].ms;
    }
  for (int c = 0; c < m; ++c) {  // Gaussian elimination, partial pivoting
    int piv = c;
    for (int r = c + 1; r < m; ++r)
      if (std::abs(A[r][c]) > std::abs(A[piv][c])) piv = r;
    for (int j = 0; j <= m; ++j) std::swap(A[c][j], A[piv][j]);
    if (std::abs(A[c][c]) < 1e-14) throw Error("latency fit: samples do not determine the coefficients (features are collinear; vary lengths and budgets)");
    for (int r = 0; r < m; ++r) {
      if (r == c) continue;
      double f = A[r][c] / A[c][c];
      for (int j = c; j <= m; ++j) A[r][j] -= f * A[c][j];
    }
  }
  std::array<double, 3> out{};
  for (int r = 0; r < m; ++r) out[fj[r]] = A[r][m] / A[r][r] / scale[r];
  return out;
}

// Least squares with every coefficient >= 0: a time cannot fall as tokens or kept blocks grow, and a
// negative slope makes short documents cost less than nothing (seen on an H200, where the attention
// part is small and noisy). With at most three features the exact solution is the best of the
// subsets whose unconstrained fit is non-negative.
static std::array<double, 3> fit_nonneg(std::span<const LatencySample> s, const std::vector<size_t>& idx, int nf) {
  const unsigned all = (1u << nf) - 1;
  auto c = least_squares(s, idx, nf, all);  // throws when the samples do not determine it
  auto feasible = [&](const std::array<double, 3>& x) { return x[0] >= 0 && x[1] >= 0 && x[2] >= 0; };
  if (feasible(c)) return c;
  std::array<double, 3> best{};
  double best_r = INFINITY;
  for (unsigned use = 1; use < all; ++use) {
    std::array<double, 3> x;
    try {
      x = least_squares(s, idx, nf, use);
    } catch (const Error&) {
      continue;
    }
    if (!feasible(x)) continue;
    double r = 0;
    for (size_t i : idx) {
      const double e = x[0] + x[1] * s[i].tokens + x[2] * s[i].x2 - s[i].ms;
      r += e * e;
    }
    if (r < best_r) best_r = r, best = x;
  }
  return best;  // all zero only if no subset fits with a non-negative coefficient (times <= 0)
}

FitReport LatencyModel::fit(Part part, std::span<const LatencySample> samples) {
  int nf = n_features(part);
  if (int(samples.size()) < nf)
    throw Error(std::string("latency fit of part '") + part_name(part) + "': " + std::to_string(samples.size()) +
                " samples, need at least " + std::to_string(nf));
  FitReport rep;
  rep.samples = int(samples.size());
  std::vector<size_t> train, held, all;
  for (size_t i = 0; i < samples.size(); ++i) (i % 5 == 4 ? held : train).push_back(i), all.push_back(i);
  if (int(train.size()) >= nf && !held.empty()) {
    auto c = fit_nonneg(samples, train, nf);
    double err = 0;
    for (size_t i : held) {
      double pred = c[0] + c[1] * samples[i].tokens + c[2] * samples[i].x2;
      err += std::abs(pred - samples[i].ms) / std::max(std::abs(samples[i].ms), 1e-12);
    }
    rep.heldout_error = err / double(held.size());
  }
  rep.coeffs = fit_nonneg(samples, all, nf);
  p_.coeffs[int(part)] = rep.coeffs;
  p_.correction[int(part)] = 1.0;
  p_.heldout_error[int(part)] = rep.heldout_error;
  p_.samples[int(part)] = rep.samples;
  return rep;
}

void LatencyModel::observe(Part part, double predicted_ms, double measured_ms) {
  if (!(predicted_ms > 0) || !(measured_ms > 0) || !std::isfinite(predicted_ms) || !std::isfinite(measured_ms)) return;
  double& c = p_.correction[int(part)];
  c = std::clamp(c * ((1 - ema_) + ema_ * measured_ms / predicted_ms), 1e-3, 1e3);
}

void LatencyModel::observe_density(double predicted_candidates, double measured_candidates) {
  if (!(predicted_candidates > 0) || !(measured_candidates >= 0)) return;
  double ratio = std::clamp(measured_candidates / predicted_candidates, 0.01, 1.0);
  p_.density = std::clamp((1 - ema_) * p_.density + ema_ * ratio, 0.01, 1.0);
}

void LatencyModel::save(hid_t group) const { save_latency_profile(group, p_); }

// `stored`: the profile is the one a checkpoint carries (a resume), not a balance.profile file.
static void check_shape(const LatencyProfile& p, const std::string& file, const ModelShape* expect, bool stored) {
  if (!expect) return;
  auto check = [&](const char* field, int64_t got, int64_t want, const char* key) {
    if (got == want) return;
    if (stored)
      throw Error(file + ": the latency model stored in this checkpoint was measured for " + field + " = " +
                  std::to_string(got) + " but this run has " + std::to_string(want) + " (" + key +
                  "); a resume keeps the checkpoint's settings: set " + key + " = " + std::to_string(got) +
                  " again, or start a fresh run from its weights with --init-from " + file);
    throw Error(file + ": latency profile was measured for " + field + " = " + std::to_string(got) +
                " but the model has " + std::to_string(want) + " (" + key +
                "); re-run `sparsebalance profile` or drop balance.profile to use the analytic model");
  };
  check("n_layers", p.n_layers, expect->n_layers, "model.n_layers");
  check("block_size", p.block_size, expect->block_size, "attention.block_size");
  check("local_blocks", p.local_blocks, expect->local_blocks, "attention.local_blocks");
}

LatencyModel LatencyModel::load(hid_t group, const std::string& file, const ModelShape* expect) {
  auto p = load_latency_profile(group, file);
  check_shape(p, file, expect, true);
  return from_profile(p);
}

LatencyModel LatencyModel::load_file(const std::string& path, const ModelShape* expect) {
  auto p = load_latency_profile_file(path);
  check_shape(p, path, expect, false);
  return from_profile(p);
}

}  // namespace sb
