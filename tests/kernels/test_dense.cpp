// gemm (all transpose combinations), linear forward/backward, AdamW.
#include <gtest/gtest.h>

#include "kernels/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = sb::kernels;
using sbtest::Rng;

namespace {

// C = alpha op(A) op(B) + beta C by a triple loop; A stored (M,K) or (K,M) with lda, etc.
template <class T>
void naive_gemm(bool ta, bool tb, int M, int N, int K, T alpha, const std::vector<T>& A, int lda,
                const std::vector<T>& B, int ldb, T beta, std::vector<T>& C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double acc = 0;
      for (int p = 0; p < K; p++) {
        double a = ta ? A[p * lda + i] : A[i * lda + p];
        double b = tb ? B[j * ldb + p] : B[p * ldb + j];
        acc += a * b;
      }
      C[i * ldc + j] = T(alpha * acc + beta * double(C[i * ldc + j]));
    }
}

template <class T>
void check_gemm(double tol) {
  Rng rng(11);
  const int M = 7, N = 5, K = 9, pad = 3;  // leading dimensions wider than the rows: strided use
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      auto A = rng.vec<T>(size_t(ta ? K : M) * lda);
      auto B = rng.vec<T>(size_t(tb ? N : K) * ldb);
      auto C = rng.vec<T>(size_t(M) * ldc);
      auto Cref = C;
      k::gemm<T>(ta, tb, M, N, K, T(0.7), A.data(), lda, B.data(), ldb, T(0.3), C.data(), ldc);
      naive_gemm<T>(ta, tb, M, N, K, T(0.7), A, lda, B, ldb, T(0.3), Cref, ldc);
      EXPECT_LT(sbtest::rel_err(C, Cref), tol) << "trans_a=" << ta << " trans_b=" << tb;
    }
}

}  // namespace

TEST(KernelsGemm, AllTransposeCombosDouble) { check_gemm<double>(1e-13); }
TEST(KernelsGemm, AllTransposeCombosFloat) { check_gemm<float>(1e-5); }

TEST(KernelsLinear, ForwardMatchesNaive) {
  Rng rng(12);
  const int N = 6, in = 11, out = 5;
  auto x = rng.vec<float>(N * in), W = rng.vec<float>(out * in);
  std::vector<float> y(N * out), yref(N * out);
  k::linear_fwd<float>(x.data(), W.data(), y.data(), N, in, out);
  for (int t = 0; t < N; t++)
    for (int o = 0; o < out; o++) {
      double acc = 0;
      for (int c = 0; c < in; c++) acc += double(x[t * in + c]) * W[o * in + c];
      yref[t * out + o] = float(acc);
    }
  EXPECT_LT(sbtest::rel_err(y, yref), 1e-6);
}

TEST(KernelsLinear, BackwardMatchesFiniteDifferences) {
  Rng rng(13);
  const int N = 5, in = 7, out = 6;
  auto x = rng.vec(N * in), W = rng.vec(out * in), wr = rng.vec(N * out);
  std::vector<double> y(N * out);
  auto loss = [&] {
    k::linear_fwd<double>(x.data(), W.data(), y.data(), N, in, out);
    return sbtest::dot(y, wr);
  };
  // The gradients accumulate (+=): start from random values and subtract them.
  auto dx0 = rng.vec(N * in), dW0 = rng.vec(out * in);
  auto dx = dx0, dW = dW0;
  k::linear_bwd<double>(x.data(), W.data(), wr.data(), dx.data(), dW.data(), N, in, out);
  for (size_t i = 0; i < dx.size(); i++) dx[i] -= dx0[i];
  for (size_t i = 0; i < dW.size(); i++) dW[i] -= dW0[i];
  EXPECT_LT(sbtest::fd_check(x, dx, loss), 1e-8);
  EXPECT_LT(sbtest::fd_check(W, dW, loss), 1e-8);
  // dx == nullptr skips the input gradient but still accumulates dW.
  auto dW2 = dW0;
  k::linear_bwd<double>(x.data(), W.data(), wr.data(), nullptr, dW2.data(), N, in, out);
  for (size_t i = 0; i < dW2.size(); i++) dW2[i] -= dW0[i];
  EXPECT_LT(sbtest::rel_err(dW2, dW), 1e-14);
}

TEST(KernelsAdamW, MatchesScalarFormula) {
  Rng rng(14);
  const size_t n = 37;
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  auto p = rng.vec<float>(n), m = rng.vec<float>(n, 0.01), v = rng.vec<float>(n, 0.01);
  for (auto& x : v) x = std::abs(x);  // second moments are non-negative
  std::vector<double> pr(p.begin(), p.end()), mr(m.begin(), m.end()), vr(v.begin(), v.end());
  for (int64_t step = 1; step <= 3; step++) {
    auto g = rng.vec<float>(n);
    k::adamw(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step);
    for (size_t i = 0; i < n; i++) {
      mr[i] = b1 * mr[i] + (1 - double(b1)) * g[i];
      vr[i] = b2 * vr[i] + (1 - double(b2)) * double(g[i]) * g[i];
      double mhat = mr[i] / (1 - std::pow(double(b1), double(step)));
      double vhat = vr[i] / (1 - std::pow(double(b2), double(step)));
      pr[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * pr[i]);
    }
    EXPECT_LT(sbtest::rel_err(m, mr), 1e-6) << "step " << step;
    EXPECT_LT(sbtest::rel_err(v, vr), 1e-6) << "step " << step;
    EXPECT_LT(sbtest::rel_err(p, pr), 1e-6) << "step " << step;
  }
}
