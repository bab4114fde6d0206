// rmsnorm, rope, swiglu, embedding, cross-entropy: forward against naive formulas, backward against
// central finite differences in double.
#include <gtest/gtest.h>

#include "kernels/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = sb::kernels;
using sbtest::Rng;

TEST(KernelsRmsNorm, ForwardAndBackward) {
  Rng rng(21);
  const int N = 4, C = 9;
  const double eps = 1e-5;
  auto x = rng.vec(N * C), w = rng.vec(C), wr = rng.vec(N * C);
  std::vector<double> y(N * C), rstd(N);
  k::rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rstd.data(), N, C, eps);
  for (int t = 0; t < N; t++) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += x[t * C + c] * x[t * C + c];
    double r = 1 / std::sqrt(ss / C + eps);
    EXPECT_NEAR(rstd[t], r, 1e-14);
    for (int c = 0; c < C; c++) EXPECT_NEAR(y[t * C + c], x[t * C + c] * r * w[c], 1e-14);
  }
  auto loss = [&] {
    k::rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rstd.data(), N, C, eps);
    return sbtest::dot(y, wr);
  };
  loss();
  auto dx0 = rng.vec(N * C), dw0 = rng.vec(C);  // gradients accumulate (+=)
  auto dx = dx0, dw = dw0;
  k::rmsnorm_bwd<double>(x.data(), w.data(), rstd.data(), wr.data(), dx.data(), dw.data(), N, C);
  for (size_t i = 0; i < dx.size(); i++) dx[i] -= dx0[i];
  for (size_t i = 0; i < dw.size(); i++) dw[i] -= dw0[i];
  EXPECT_LT(sbtest::fd_check(x, dx, loss), 1e-7);
  EXPECT_LT(sbtest::fd_check(w, dw, loss), 1e-7);
}

// The plain table (theta^(-2d/D)) at scale 1, and a scaled table with an attention factor (YaRN's
// shape: any inv_freq, cos and sin times the scale): the formula, the inverse and the gradient.
static void check_rope(const std::vector<double>& inv_freq, double scale, uint64_t seed) {
  Rng rng(seed);
  const int N = 5, nh = 3, D = int(inv_freq.size()) * 2;
  const k::RopeFreqs f{inv_freq.data(), scale};
  std::vector<int32_t> pos = {0, 1, 7, 300, 4095};
  auto x0 = rng.vec(N * nh * D);
  auto x = x0;
  k::rope_fwd<double>(x.data(), pos.data(), N, nh, D, f);
  for (int t = 0; t < N; t++)
    for (int h = 0; h < nh; h++) {
      const double* a = &x0[(t * nh + h) * D];
      const double* b = &x[(t * nh + h) * D];
      double n0 = 0, n1 = 0;
      for (int d = 0; d < D; d++) n0 += a[d] * a[d], n1 += b[d] * b[d];
      EXPECT_NEAR(n0 * scale * scale, n1, 1e-12) << "a scaled rotation scales the norm";
      for (int d = 0; d < D / 2; d++) {
        double ang = pos[t] * inv_freq[d];
        EXPECT_NEAR(b[d], scale * (a[d] * std::cos(ang) - a[d + D / 2] * std::sin(ang)), 1e-12);
        EXPECT_NEAR(b[d + D / 2], scale * (a[d + D / 2] * std::cos(ang) + a[d] * std::sin(ang)), 1e-12);
      }
      if (pos[t] == 0) {
        for (int d = 0; d < D; d++) EXPECT_NEAR(a[d] * scale, b[d], 1e-15) << "position 0 only scales";
      }
    }
  // rope_bwd is scale times the inverse rotation: bwd(fwd(x)) == scale^2 x.
  auto back = x;
  k::rope_bwd<double>(back.data(), pos.data(), N, nh, D, f);
  for (auto& v : back) v /= scale * scale;
  EXPECT_LT(sbtest::rel_err(back, x0), 1e-14);
  auto xf = std::vector<float>(x0.begin(), x0.end());
  k::rope_fwd<float>(xf.data(), pos.data(), N, nh, D, f);
  EXPECT_LT(sbtest::rel_err(xf, x), 1e-6);
  // And it is the gradient: loss = sum(rope(x) * wr)  ->  dx = rope_bwd(wr).
  auto wr = rng.vec(N * nh * D);
  auto xv = x0;
  auto loss = [&] {
    auto y = xv;
    k::rope_fwd<double>(y.data(), pos.data(), N, nh, D, f);
    return sbtest::dot(y, wr);
  };
  auto dx = wr;
  k::rope_bwd<double>(dx.data(), pos.data(), N, nh, D, f);
  EXPECT_LT(sbtest::fd_check(xv, dx, loss), 1e-8);
}

TEST(KernelsRope, MatchesHuggingFaceFormulaAndGradient) {
  const auto plain = k::rope_plain_inv_freq(8, 10000.0);
  for (int d = 0; d < 4; d++) EXPECT_DOUBLE_EQ(plain[d], std::pow(10000.0, -2.0 * d / 8));
  check_rope(plain, 1.0, 22);
}

TEST(KernelsRope, ScaledTableAndAttentionFactor) {
  check_rope({0.9, 0.31, 0.0123, 1.7e-4, 3e-6}, 1.1386, 24);  // D = 10, YaRN-like scale 0.1 ln(4) + 1
}

TEST(KernelsSwiglu, ForwardAndBackward) {
  Rng rng(23);
  const size_t n = 40;
  auto gate = rng.vec(n, 3.0), up = rng.vec(n), wr = rng.vec(n);
  std::vector<double> h(n);
  k::swiglu_fwd<double>(gate.data(), up.data(), h.data(), n);
  for (size_t i = 0; i < n; i++) EXPECT_NEAR(h[i], gate[i] / (1 + std::exp(-gate[i])) * up[i], 1e-14);
  auto loss = [&] {
    k::swiglu_fwd<double>(gate.data(), up.data(), h.data(), n);
    return sbtest::dot(h, wr);
  };
  std::vector<double> dg(n, 7.0), du(n, 7.0);  // overwritten, not accumulated
  k::swiglu_bwd<double>(gate.data(), up.data(), wr.data(), dg.data(), du.data(), n);
  EXPECT_LT(sbtest::fd_check(gate, dg, loss), 1e-8);
  EXPECT_LT(sbtest::fd_check(up, du, loss), 1e-8);
}

TEST(KernelsEmbedding, ForwardAndBackwardWithRepeatedIds) {
  Rng rng(24);
  const int V = 6, C = 70, N = 9;  // C > 64: more than one column chunk in the backward
  std::vector<int32_t> ids = {3, 0, 3, 5, 1, 3, 0, 2, 5};
  auto table = rng.vec(V * C), wr = rng.vec(N * C);
  std::vector<double> out(N * C);
  k::embedding_fwd<double>(ids.data(), table.data(), out.data(), N, C);
  for (int t = 0; t < N; t++)
    for (int c = 0; c < C; c++) EXPECT_EQ(out[t * C + c], table[ids[t] * C + c]);
  auto loss = [&] {
    k::embedding_fwd<double>(ids.data(), table.data(), out.data(), N, C);
    return sbtest::dot(out, wr);
  };
  auto d0 = rng.vec(V * C);
  auto dt = d0;
  k::embedding_bwd<double>(ids.data(), wr.data(), dt.data(), N, C);
  for (size_t i = 0; i < dt.size(); i++) dt[i] -= d0[i];
  EXPECT_LT(sbtest::fd_check(table, dt, loss), 1e-8);
}

TEST(KernelsCrossEntropy, MatchesNaiveLogSoftmaxAndGradient) {
  Rng rng(25);
  const int N = 6, V = 11;
  const double scale = 0.37;
  auto logits = rng.vec(N * V, 4.0);
  logits[2 * V + 4] = 300.0;  // large logit: the naive exp would overflow without the max shift
  std::vector<int32_t> tg = {3, -1, 4, 0, 10, 7};
  // Naive log-softmax in long double with an explicit max shift per row.
  double ref = 0;
  std::vector<uint8_t> ref_correct(N);
  for (int t = 0; t < N; t++) {
    long double mx = logits[t * V], s = 0;
    int am = 0;
    for (int v = 0; v < V; v++)
      if (logits[t * V + v] > mx) mx = logits[t * V + v], am = v;
    for (int v = 0; v < V; v++) s += std::exp((long double)logits[t * V + v] - mx);
    if (tg[t] >= 0) ref += double(-(logits[t * V + tg[t]] - mx - std::log(s)));
    ref_correct[t] = tg[t] >= 0 && am == tg[t];
  }
  std::vector<double> dl(N * V, 5.0);
  std::vector<uint8_t> correct(N, 9);
  double loss = k::cross_entropy<double>(logits.data(), tg.data(), dl.data(), N, V, scale, correct.data());
  EXPECT_NEAR(loss, ref, 1e-12 * std::abs(ref));
  EXPECT_EQ(correct, ref_correct);
  EXPECT_EQ(correct[2], 1);
  for (int v = 0; v < V; v++) EXPECT_EQ(dl[1 * V + v], 0.0) << "untargeted row";
  // Gradient: d(scale * loss)/dlogits.
  auto f = [&] { return scale * k::cross_entropy<double>(logits.data(), tg.data(), nullptr, N, V, 1.0); };
  logits[2 * V + 4] = 3.0;  // keep finite differences well conditioned
  k::cross_entropy<double>(logits.data(), tg.data(), dl.data(), N, V, scale);
  EXPECT_LT(sbtest::fd_check(logits, dl, f), 1e-8);
  // dlogits may alias logits.
  auto alias = logits;
  double l2 = k::cross_entropy<double>(alias.data(), tg.data(), alias.data(), N, V, scale);
  EXPECT_NEAR(l2, k::cross_entropy<double>(logits.data(), tg.data(), nullptr, N, V, scale), 1e-13);
  EXPECT_LT(sbtest::rel_err(alias, dl), 1e-15);
  // Float agrees with double.
  std::vector<float> lf(logits.begin(), logits.end()), df(N * V);
  double lossf = k::cross_entropy<float>(lf.data(), tg.data(), df.data(), N, V, float(scale));
  EXPECT_NEAR(lossf, k::cross_entropy<double>(logits.data(), tg.data(), nullptr, N, V, scale), 1e-5);
  EXPECT_LT(sbtest::rel_err(df, dl), 1e-5);
}
