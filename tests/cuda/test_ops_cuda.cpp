// CUDA elementwise / per-row kernels and bf16 GEMMs (kernels/cuda/ops_cuda.hpp) against the CPU
// kernels of kernels.hpp run in double, on fresh random inputs (rounded to bf16 wherever the GPU reads
// bf16, so both sides see the same numbers). Outputs are poisoned (0xFF bytes: NaN in fp32 and bf16,
// -1 in int32) before every GPU run and checked fully written; the error is ||gpu - ref|| / ||ref||.
// Tolerances: 1e-2 for bf16 outputs (bf16 rounding is ~1e-3 rms); 1e-3 for GEMMs with fp32 output
// (same bf16 inputs on both sides, so only fp32 accumulation order differs: expect ~1e-6); 1e-5 for
// fp32-output math (rmsnorm rstd/backward, embedding, CE loss, AdamW); bitwise for to_bf16, add,
// scale; 1e-12 for sum_squares (double accumulation of exact squares).
// Exit 0 all passed, 1 a failure, 77 no usable GPU (ctest SKIP). --quick: smaller sizes
// (compute-sanitizer).
#include <Kokkos_Core.hpp>

#include "tests/cuda/ops_check.hpp"

using namespace opcheck;

void test_fused(bool quick);  // test_ops_fused.cpp
void test_lora_dropout(size_t n, double p);  // test_ops_lora.cpp

namespace {

// ---- GEMM ----
// C (M,N) = alpha op(A) op(B) + beta C with padded leading dimensions; padding of C must stay as it was.
template <class CT>
void check_gemm(int M, int N, int K, bool ta, bool tb, float alpha, float beta, C::Blas& blas) {
  const int rowsA = ta ? K : M, lda = (ta ? M : K) + 3;
  const int rowsB = tb ? N : K, ldb = (tb ? K : N) + 5;
  const int ldc = N + 7;
  constexpr bool c16 = std::is_same_v<CT, bf16>;
  const double sentinel = 1024.0;  // in the padding of C, exact in bf16
  std::vector<double> A = randn(size_t(rowsA) * lda, 1.0), B = randn(size_t(rowsB) * ldb, 1.0);
  std::vector<double> Cin = randn(size_t(M) * ldc, 2.0, 0.0, c16), Cref(Cin.size());
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) {
      double& c = Cin[size_t(i) * ldc + j];
      if (j >= N) c = sentinel;
      else if (beta == 0) c = std::numeric_limits<double>::quiet_NaN();  // must not be read
      Cref[size_t(i) * ldc + j] = (beta == 0 && j < N) ? 0.0 : c;
    }
  K::gemm<double>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, Cref.data(), ldc);
  Dev<bf16> dA(to_b(A)), dB(to_b(B));
  std::vector<double> got;
  if constexpr (c16) {
    Dev<bf16> dC(to_b(Cin));
    C::gemm(blas, ta, tb, M, N, K, alpha, dA.p, lda, dB.p, ldb, beta, dC.p, ldc);
    got = to_d(dC.down());
  } else {
    Dev<float> dC(to_f(Cin));
    C::gemm(blas, ta, tb, M, N, K, alpha, dA.p, lda, dB.p, ldb, beta, dC.p, ldc);
    got = to_d(dC.down());
  }
  std::vector<double> g, r;
  size_t pad_bad = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) {
      const size_t o = size_t(i) * ldc + j;
      if (j < N) {
        g.push_back(got[o]);
        r.push_back(Cref[o]);
      } else {
        pad_bad += got[o] != sentinel;
      }
    }
  char name[128];
  std::snprintf(name, sizeof name, "gemm %c%c M%d N%d K%d C %s beta %g", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
                c16 ? "bf16" : "fp32", beta);
  report(name, compare(g, r), c16 ? kTolBf16 : kTolGemm32, pad_bad, pad_bad ? "padding of C overwritten" : "");
}

void test_gemm(C::Blas& blas) {
  std::vector<std::array<int, 3>> shapes = {{67, 45, 83}, {128, 256, 192}};
  if (!g_quick) shapes.push_back({300, 520, 1000});
  for (auto [M, N, K] : shapes)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (float beta : {0.0f, 1.0f}) {
          check_gemm<float>(M, N, K, ta, tb, 0.75f, beta, blas);
          check_gemm<bf16>(M, N, K, ta, tb, 0.75f, beta, blas);
        }
}

// ---- linear ----
template <class YT>
void check_linear(int N, int in, int out, C::Blas& blas) {
  constexpr bool y16 = std::is_same_v<YT, bf16>;
  const char* tn = y16 ? "bf16" : "fp32";
  std::vector<double> x = randn(size_t(N) * in, 1.0), W = randn(size_t(out) * in, 0.1),
                      dy = randn(size_t(N) * out, 1.0);
  Dev<bf16> dx_in(to_b(x)), dW_in(to_b(W)), ddy(to_b(dy));
  auto run_down = [&](auto& dev) { return to_d(dev.down()); };
  char name[128];
  {  // forward: y overwritten
    std::vector<double> y(size_t(N) * out);
    K::linear_fwd<double>(x.data(), W.data(), y.data(), N, in, out);
    Dev<YT> dy_out(y.size());
    dy_out.poison();
    C::linear_fwd(blas, dx_in.p, dW_in.p, dy_out.p, N, in, out);
    std::snprintf(name, sizeof name, "linear_fwd N%d in%d out%d y %s", N, in, out, tn);
    report(name, compare(run_down(dy_out), y), y16 ? kTolBf16 : kTolGemm32);
  }
  // backward: dx accumulated, overwritten (poisoned before), or skipped; dW always accumulated
  for (int mode = 0; mode < 3; mode++) {
    const bool acc = mode == 0, skip = mode == 2;
    std::vector<double> dW0 = randn(size_t(out) * in, 0.5, 0.0, false), dWr = dW0;
    std::vector<double> dx0 = randn(size_t(N) * in, 1.0, 0.0, y16), dxr(dx0.size(), 0.0);
    if (acc) dxr = dx0;
    K::linear_bwd<double>(x.data(), W.data(), dy.data(), skip ? nullptr : dxr.data(), dWr.data(), N, in, out);
    Dev<float> ddW(to_f(dW0));
    Dev<YT> ddx(dx0.size());
    if (acc) {
      if constexpr (y16) ddx.up(to_b(dx0));
      else ddx.up(to_f(dx0));
    } else {
      ddx.poison();
    }
    C::linear_bwd(blas, dx_in.p, dW_in.p, ddy.p, skip ? nullptr : ddx.p, acc, ddW.p, N, in, out);
    const char* mn = acc ? "accumulate" : skip ? "dx=nullptr" : "overwrite";
    std::snprintf(name, sizeof name, "linear_bwd N%d in%d out%d dW (dx %s %s)", N, in, out, tn, mn);
    report(name, compare(run_down(ddW), dWr), kTolGemm32);
    if (!skip) {
      std::snprintf(name, sizeof name, "linear_bwd N%d in%d out%d dx %s %s", N, in, out, tn, mn);
      report(name, compare(run_down(ddx), dxr), y16 ? kTolBf16 : kTolGemm32);
    } else {  // dx untouched: still all poison
      size_t touched = 0;
      for (double v : run_down(ddx)) touched += !std::isnan(v);
      std::snprintf(name, sizeof name, "linear_bwd N%d in%d out%d dx %s nullptr untouched", N, in, out, tn);
      report(name, Err{}, 0.0, touched);
    }
  }
}

void test_linear(C::Blas& blas) {
  check_linear<float>(45, 96, 80, blas);
  check_linear<bf16>(45, 96, 80, blas);
  if (!g_quick) {
    check_linear<float>(200, 256, 384, blas);
    check_linear<bf16>(200, 256, 384, blas);
  }
}

// ---- rmsnorm ----
void test_rmsnorm(int N, int Cc) {
  const size_t n = size_t(N) * Cc;
  const double eps = 1e-5;
  std::vector<double> x = randn(n, 1.5, 0.3, false), w = randn(Cc, 0.2, 1.0, false);
  std::vector<double> y(n), rstd(N);
  K::rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rstd.data(), N, Cc, eps);
  Dev<float> dxin(to_f(x)), dw(to_f(w)), drstd(N);
  Dev<bf16> dy_out(n);
  dy_out.poison();
  drstd.poison();
  C::rmsnorm_fwd(dxin.p, dw.p, dy_out.p, drstd.p, N, Cc, float(eps), g_stream);
  char name[128];
  std::snprintf(name, sizeof name, "rmsnorm_fwd N%d C%d y", N, Cc);
  report(name, compare(to_d(dy_out.down()), y), kTolBf16);
  std::snprintf(name, sizeof name, "rmsnorm_fwd N%d C%d rstd", N, Cc);
  report(name, compare(to_d(drstd.down()), rstd), kTolF32);

  // backward with the same fp32 rstd on both sides; dx, dw accumulate onto random values
  std::vector<double> rs(N);
  for (int t = 0; t < N; t++) rs[t] = float(rstd[t]);
  std::vector<double> dyv = randn(n, 1.0, 0.0, false), dx = randn(n, 1.0, 0.0, false), dwv = randn(Cc, 1.0, 0.0, false);
  Dev<float> ddy(to_f(dyv)), ddx(to_f(dx)), ddw(to_f(dwv)), drs(to_f(rs));
  K::rmsnorm_bwd<double>(x.data(), w.data(), rs.data(), dyv.data(), dx.data(), dwv.data(), N, Cc);
  C::rmsnorm_bwd(dxin.p, dw.p, drs.p, ddy.p, ddx.p, ddw.p, N, Cc, g_stream);
  std::snprintf(name, sizeof name, "rmsnorm_bwd N%d C%d dx", N, Cc);
  report(name, compare(to_d(ddx.down()), dx), kTolF32);
  std::snprintf(name, sizeof name, "rmsnorm_bwd N%d C%d dw", N, Cc);
  report(name, compare(to_d(ddw.down()), dwv), kTolF32);
}

// ---- rope ----
void test_rope(int N, int nh, int D, double theta, double scale = 1.0) {
  std::vector<int32_t> pos(N);
  std::uniform_int_distribution<int> P(0, 70000);
  for (auto& p : pos) p = P(g_rng);
  const int32_t fixed[] = {0, 1, 69999, 70000, 65536, 4095};
  for (int i = 0; i < 6 && i < N; i++) pos[i] = fixed[i];
  Dev<int32_t> dpos(pos);
  // RoPE's table (src/model/rope.hpp): plain, or YaRN-like (scale != 1: the upper half of the
  // frequencies divided by 4, cos and sin times scale)
  std::vector<double> freq = K::rope_plain_inv_freq(D, theta);
  if (scale != 1.0)
    for (size_t d = freq.size() / 2; d < freq.size(); d++) freq[d] /= 4;
  Dev<double> dfreq(freq);
  const K::RopeFreqs hr{freq.data(), scale}, dr{dfreq.p, scale};
  const size_t n = size_t(N) * nh * D;
  char name[128];
  for (int bwd = 0; bwd < 2; bwd++) {
    std::vector<double> x = randn(n, 1.0);
    Dev<bf16> dx(to_b(x));  // in place: the input is the output, nothing to poison
    if (bwd) {
      K::rope_bwd<double>(x.data(), pos.data(), N, nh, D, hr);
      C::rope_bwd(dx.p, dpos.p, N, nh, D, dr, g_stream);
    } else {
      K::rope_fwd<double>(x.data(), pos.data(), N, nh, D, hr);
      C::rope_fwd(dx.p, dpos.p, N, nh, D, dr, g_stream);
    }
    std::snprintf(name, sizeof name, "rope_%s N%d nh%d D%d theta %.0f scale %.4f pos<=70000", bwd ? "bwd" : "fwd", N,
                  nh, D, theta, scale);
    report(name, compare(to_d(dx.down()), x), kTolBf16);
  }
}

// ---- swiglu ----
void test_swiglu(size_t n) {
  std::vector<double> g = randn(n, 2.5), u = randn(n, 1.0), dh = randn(n, 1.0);
  std::vector<double> h(n), dg(n), du(n);
  K::swiglu_fwd<double>(g.data(), u.data(), h.data(), n);
  K::swiglu_bwd<double>(g.data(), u.data(), dh.data(), dg.data(), du.data(), n);
  Dev<bf16> dgate(to_b(g)), dup_in(to_b(u)), ddh(to_b(dh)), dhout(n), ddg(n), ddu(n);
  dhout.poison();
  ddg.poison();
  ddu.poison();
  C::swiglu_fwd(dgate.p, dup_in.p, dhout.p, n, g_stream);
  C::swiglu_bwd(dgate.p, dup_in.p, ddh.p, ddg.p, ddu.p, n, g_stream);
  char name[128];
  std::snprintf(name, sizeof name, "swiglu_fwd n%zu h", n);
  report(name, compare(to_d(dhout.down()), h), kTolBf16);
  std::snprintf(name, sizeof name, "swiglu_bwd n%zu dgate", n);
  report(name, compare(to_d(ddg.down()), dg), kTolBf16);
  std::snprintf(name, sizeof name, "swiglu_bwd n%zu dup", n);
  report(name, compare(to_d(ddu.down()), du), kTolBf16);
  // the 16-byte kernels (fused.cu; n % 8 != 0 takes the scalar ones): the same bits
  Dev<bf16> wh(n), wdg(n), wdu(n);
  wh.poison();
  wdg.poison();
  wdu.poison();
  C::swiglu_fwd_wide(dgate.p, dup_in.p, wh.p, n, g_stream);
  C::swiglu_bwd_wide(dgate.p, dup_in.p, ddh.p, wdg.p, wdu.p, n, g_stream);
  const size_t differ = bits_differ(wh.down(), dhout.down()) + bits_differ(wdg.down(), ddg.down()) +
                        bits_differ(wdu.down(), ddu.down());
  std::snprintf(name, sizeof name, "swiglu_fwd/bwd_wide n%zu == scalar", n);
  report(name, Err{}, 0, differ);
}

// ---- embedding ----
void test_embedding(int V, int Cc, int N) {
  std::vector<int32_t> ids(N);
  std::uniform_int_distribution<int> hot(0, 39), all(0, V - 1);
  for (int t = 0; t < N; t++) ids[t] = (t % 4 == 3) ? all(g_rng) : hot(g_rng);  // many repeats
  ids[0] = V - 1;
  ids[N - 1] = V - 1;
  std::vector<double> table = randn(size_t(V) * Cc, 1.0, 0.0, false), out(size_t(N) * Cc);
  K::embedding_fwd<double>(ids.data(), table.data(), out.data(), N, Cc);
  Dev<int32_t> dids(ids);
  Dev<float> dtable(to_f(table)), dout(out.size());
  dout.poison();
  C::embedding_fwd(dids.p, dtable.p, dout.p, N, Cc, g_stream);
  char name[128];
  std::snprintf(name, sizeof name, "embedding_fwd V%d C%d N%d", V, Cc, N);
  report(name, compare(to_d(dout.down()), out), kTolF32);
  // a bf16 table (LoRA's frozen embedding): the same rows of its bf16 values, exactly
  const std::vector<double> t16 = randn(size_t(V) * Cc, 1.0);  // rounded to bf16
  std::vector<double> out16(size_t(N) * Cc);
  K::embedding_fwd<double>(ids.data(), t16.data(), out16.data(), N, Cc);
  Dev<bf16> dt16(to_b(t16));
  dout.poison();
  C::embedding_fwd(dids.p, dt16.p, dout.p, N, Cc, g_stream);
  std::snprintf(name, sizeof name, "embedding_fwd bf16 table V%d C%d N%d", V, Cc, N);
  report(name, compare(to_d(dout.down()), out16), kTolF32);

  std::vector<double> g = randn(size_t(N) * Cc, 1.0, 0.0, false), dt = randn(size_t(V) * Cc, 1.0, 0.0, false);
  Dev<float> dg(to_f(g)), ddt(to_f(dt));
  K::embedding_bwd<double>(ids.data(), g.data(), dt.data(), N, Cc);
  C::embedding_bwd(dids.p, dg.p, ddt.p, N, Cc, g_stream);
  std::snprintf(name, sizeof name, "embedding_bwd V%d C%d N%d repeated ids", V, Cc, N);
  report(name, compare(to_d(ddt.down()), dt), kTolF32);
}

// ---- cross-entropy ----
// bf16: cross_entropy_inplace over bf16 logits (the reference on the same bf16 values), dlogits
// written over them; else cross_entropy over fp32 logits into a separate dlogits buffer.
void test_cross_entropy(int N, int V, double offset, double sd, bool bf) {
  std::vector<double> z = randn(size_t(N) * V, sd, offset, bf);
  std::vector<int32_t> tgt(N);
  std::uniform_int_distribution<int> U(0, V - 1);
  std::uniform_real_distribution<double> R(0, 1);
  int ntgt = 0;
  for (int t = 0; t < N; t++) {
    tgt[t] = (t == 0 || (t > 1 && R(g_rng) < 0.25)) ? -1 : U(g_rng);
    if (t % 5 == 2) {  // ties for the max, near and far apart (strides 1, 512, 1027): lowest index wins
      const int j = U(g_rng), far = U(g_rng);
      const double m = *std::max_element(z.begin() + size_t(t) * V, z.begin() + size_t(t + 1) * V);
      const double top = bf ? double(bfr(m + 1.0)) : double(float(m + 1.0));
      for (int jj : {j, (j + 1) % V, (j + 512) % V, (j + 1027) % V, far}) z[size_t(t) * V + jj] = top;
    }
    if (t % 7 == 3 && tgt[t] >= 0)  // target at the max (small loss)
      tgt[t] = int(std::max_element(z.begin() + size_t(t) * V, z.begin() + size_t(t + 1) * V) - z.begin() -
                   size_t(t) * V);
    ntgt += tgt[t] >= 0;
  }
  const float scale = 1.0f / float(std::max(ntgt, 1));
  // reference row by row (kernels::cross_entropy returns the sum over its rows)
  std::vector<double> loss(N), dl(z.size());
  std::vector<int32_t> amax(N);
  std::vector<uint8_t> correct(N);
  for (int t = 0; t < N; t++) {
    const double* zr = z.data() + size_t(t) * V;
    loss[t] = K::cross_entropy<double>(zr, &tgt[t], dl.data() + size_t(t) * V, 1, V, double(scale), &correct[t]);
    amax[t] = int32_t(std::max_element(zr, zr + V) - zr);  // first maximum
  }
  Dev<float> dloss(N);
  Dev<int32_t> dtgt(tgt), damax(N);
  dloss.poison();
  damax.poison();
  std::vector<double> gdl;
  if (bf) {
    Dev<bf16> dz(to_b(z));
    C::cross_entropy_inplace(dz.p, dtgt.p, dloss.p, true, damax.p, N, V, scale, g_stream);
    gdl = to_d(dz.down());
  } else {
    Dev<float> dz(to_f(z));
    Dev<bf16> ddl(z.size());
    ddl.poison();
    C::cross_entropy(dz.p, dtgt.p, dloss.p, ddl.p, damax.p, N, V, scale, g_stream);
    gdl = to_d(ddl.down());
  }
  const auto gl = to_d(dloss.down());
  const auto ga = damax.down();
  size_t amax_bad = 0, untargeted_bad = 0, correct_bad = 0;
  for (int t = 0; t < N; t++) {
    amax_bad += ga[t] != amax[t];
    correct_bad += uint8_t(tgt[t] >= 0 && ga[t] == tgt[t]) != correct[t];
    if (tgt[t] < 0) {
      untargeted_bad += gl[t] != 0.0;
      for (int v = 0; v < V; v++) untargeted_bad += gdl[size_t(t) * V + v] != 0.0;
    }
  }
  char name[128], note[128];
  const char* kind = bf ? "bf16 in place" : "fp32";
  std::snprintf(name, sizeof name, "cross_entropy %s N%d V%d offset %g loss", kind, N, V, offset);
  std::snprintf(note, sizeof note, "%d targeted rows; %zu untargeted entries nonzero", ntgt, untargeted_bad);
  report(name, compare(gl, loss), kTolF32, untargeted_bad, note);
  std::snprintf(name, sizeof name, "cross_entropy %s N%d V%d offset %g dlogits", kind, N, V, offset);
  report(name, compare(gdl, dl), kTolBf16);
  std::snprintf(name, sizeof name, "cross_entropy %s N%d V%d offset %g argmax (ties)", kind, N, V, offset);
  std::snprintf(note, sizeof note, "%zu argmax mismatches, %zu 'correct' mismatches", amax_bad, correct_bad);
  report(name, Err{}, 0.0, amax_bad + correct_bad, note);
}

// One NaN logit in a targeted row makes its loss NaN, as kernels::cross_entropy gives, wherever it
// sits: each row has it at another index (the first, last, and in other threads' and warps' parts),
// so the partial sums that carry it meet larger maxima in the reduction's merges.
void test_cross_entropy_nan(int V, bool bf) {
  const int N = 8;
  std::vector<double> z = randn(size_t(N) * V, 2.0, 0.0, bf);
  std::vector<int32_t> tgt(N);
  const int at[N] = {0, V - 1, V / 2, 7, 8 * 512 + 3, V / 3, 1, V - 9};
  for (int t = 0; t < N; t++) {
    z[size_t(t) * V + size_t(at[t] % V)] = std::numeric_limits<double>::quiet_NaN();
    tgt[t] = (at[t] + 5) % V;
  }
  double ref = K::cross_entropy<double>(z.data(), tgt.data(), nullptr, N, V, 1.0, nullptr);
  Dev<float> dloss(N);
  Dev<int32_t> dtgt(tgt), damax(N);
  if (bf) {
    Dev<bf16> dz(to_b(z));
    C::cross_entropy_inplace(dz.p, dtgt.p, dloss.p, false, damax.p, N, V, 1.0f, g_stream);
  } else {
    Dev<float> dz(to_f(z));
    C::cross_entropy(dz.p, dtgt.p, dloss.p, nullptr, damax.p, N, V, 1.0f, g_stream);
  }
  size_t finite = 0;
  for (float l : dloss.down()) finite += std::isfinite(l);
  char name[128];
  std::snprintf(name, sizeof name, "cross_entropy %s V%d: a NaN logit gives a NaN loss", bf ? "bf16" : "fp32", V);
  report(name, Err{}, 0.0, finite + size_t(std::isfinite(ref)), std::to_string(finite) + " finite of 8 rows");
}

// ---- AdamW ----
void test_adamw(size_t n, float wd) {
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
  std::vector<float> p = to_f(randn(n, 1.0, 0.0, false)), m = to_f(randn(n, 0.01, 0.0, false)), v(n);
  {
    const auto vv = randn(n, 1e-4, 0.0, false);
    for (size_t i = 0; i < n; i++) v[i] = float(std::fabs(vv[i])) + 1e-9f;
  }
  Dev<float> dp(p), dm(m), dv(v), dg(n);
  Dev<bf16> dp16(n);
  const int64_t steps[] = {1, 2, 3, 10};
  char name[128];
  for (int s = 0; s < 4; s++) {
    const std::vector<float> g = to_f(randn(n, 0.1, 0.0, false));
    dg.up(g);
    K::adamw(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, steps[s]);
    const bool with16 = s != 1;  // one step without the bf16 copy
    dp16.poison();
    C::adamw(dp.p, with16 ? dp16.p : nullptr, dg.p, dm.p, dv.p, n, lr, b1, b2, eps, wd, steps[s], g_stream);
    const auto gp = dp.down();
    std::snprintf(name, sizeof name, "adamw n%zu wd %g step %lld p", n, wd, (long long)steps[s]);
    report(name, compare(to_d(gp), to_d(p)), kTolF32);
    std::snprintf(name, sizeof name, "adamw n%zu wd %g step %lld m", n, wd, (long long)steps[s]);
    report(name, compare(to_d(dm.down()), to_d(m)), kTolF32);
    std::snprintf(name, sizeof name, "adamw n%zu wd %g step %lld v", n, wd, (long long)steps[s]);
    report(name, compare(to_d(dv.down()), to_d(v)), kTolF32);
    const auto g16 = dp16.down();
    if (with16) {  // p16 == bf16(p) of the GPU's own p, bit for bit, and close to bf16(p_ref)
      size_t mism = 0;
      std::vector<double> ref16(n);
      for (size_t i = 0; i < n; i++) {
        mism += bits(g16[i]) != bits(__float2bfloat16(gp[i]));
        ref16[i] = bfr(p[i]);
      }
      std::snprintf(name, sizeof name, "adamw n%zu wd %g step %lld p16", n, wd, (long long)steps[s]);
      report(name, compare(to_d(g16), ref16), kTolBf16, mism, mism ? "p16 != bf16(p)" : "");
    } else {
      size_t touched = 0;
      for (auto x : g16) touched += bits(x) != 0xFFFFu;
      std::snprintf(name, sizeof name, "adamw n%zu wd %g step %lld p16=nullptr untouched", n, wd, (long long)steps[s]);
      report(name, Err{}, 0.0, touched);
    }
  }
}

// ---- to_bf16, add_inplace, scale_inplace, sum_squares ----
void test_misc(size_t n) {
  std::vector<float> x(n), y(n);
  std::normal_distribution<double> N01(0, 1);
  std::uniform_real_distribution<double> E(-20, 20);
  for (size_t i = 0; i < n; i++) {
    x[i] = float(N01(g_rng) * std::exp2(E(g_rng)));  // wide exponent range
    y[i] = float(N01(g_rng));
  }
  char name[128];
  {
    Dev<float> dx(x);
    Dev<bf16> dy(n);
    dy.poison();
    C::to_bf16(dx.p, dy.p, n, g_stream);
    const auto h = dy.down();
    size_t mism = 0;
    for (size_t i = 0; i < n; i++) mism += bits(h[i]) != bits(__float2bfloat16(x[i]));
    std::snprintf(name, sizeof name, "to_bf16 n%zu (bitwise vs host RNE)", n);
    std::vector<double> r(n);
    for (size_t i = 0; i < n; i++) r[i] = bfr(x[i]);
    report(name, compare(to_d(h), r), 0.0, mism);
  }
  {
    Dev<float> dx(x), dy(y);
    C::add_inplace(dx.p, dy.p, n, g_stream);
    auto h = dx.down();
    size_t mism = 0;
    std::vector<double> r(n);
    for (size_t i = 0; i < n; i++) {
      const float e = x[i] + y[i];
      mism += bits(h[i]) != bits(e);
      r[i] = e;
    }
    std::snprintf(name, sizeof name, "add_inplace n%zu (bitwise)", n);
    report(name, compare(to_d(h), r), 0.0, mism);
    const float c = -0.37f;
    C::scale_inplace(dx.p, c, n, g_stream);
    const auto h2 = dx.down();
    mism = 0;
    for (size_t i = 0; i < n; i++) {
      const float e = h[i] * c;
      mism += bits(h2[i]) != bits(e);
      r[i] = e;
    }
    std::snprintf(name, sizeof name, "scale_inplace n%zu (bitwise)", n);
    report(name, compare(to_d(h2), r), 0.0, mism);
  }
  {
    Dev<float> dx(y);
    for (size_t m : {size_t(0), size_t(1), size_t(257), n}) {
      double ref = 0;
      for (size_t i = 0; i < m; i++) ref += double(y[i]) * y[i];
      const double got = C::sum_squares(dx.p, m, g_stream);
      Err e;
      e.rel = ref > 0 ? std::fabs(got - ref) / ref : std::fabs(got);
      e.bad = !std::isfinite(got);
      std::snprintf(name, sizeof name, "sum_squares n%zu", m);
      report(name, e, 1e-12);
    }
  }
}

// 64-bit indexing: n > 2^31 floats (8.6 GB), a constant pattern, so the references are closed-form.
void test_huge() {
  const size_t n = (size_t(1) << 31) + 4099;
  float* x = nullptr;
  bf16* y = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(float)) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&y), n * sizeof(bf16)) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(x);
    std::printf("SKIP 64-bit indexing check: cannot allocate %.1f GB\n", n * 6.0 / 1e9);
    return;
  }
  struct Free {
    void* a;
    void* b;
    ~Free() {
      cudaFree(a);
      cudaFree(b);
    }
  } guard{x, y};
  SB_CUDA_CHECK(cudaMemset(x, 0x3F, n * sizeof(float)));  // every x = 0x3F3F3F3F ~ 0.747
  SB_CUDA_CHECK(cudaMemset(y, 0xFF, n * sizeof(bf16)));
  float v;
  const uint32_t pat = 0x3F3F3F3Fu;
  std::memcpy(&v, &pat, 4);
  auto tail_ok = [&](float expect) {  // the last elements, past 2^31
    float h[4];
    SB_CUDA_CHECK(cudaDeviceSynchronize());
    SB_CUDA_CHECK(cudaMemcpy(h, x + n - 4, sizeof h, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (float f : h) bad += f != expect;
    return bad;
  };
  char name[128];
  double ref = double(n) * double(v) * double(v);
  double got = C::sum_squares(x, n, g_stream);
  std::snprintf(name, sizeof name, "sum_squares n=2^31+4099");
  report(name, Err{std::fabs(got - ref) / ref, 0}, 1e-12);
  C::scale_inplace(x, 2.0f, n, g_stream);
  C::add_inplace(x, x, n, g_stream);  // x = 4v everywhere
  got = C::sum_squares(x, n, g_stream);
  report("scale_inplace+add_inplace n=2^31+4099 (sum_squares, tail)", Err{std::fabs(got - 16 * ref) / (16 * ref), 0},
         1e-12, tail_ok(4 * v));
  C::to_bf16(x, y, n, g_stream);
  bf16 h[4];
  SB_CUDA_CHECK(cudaDeviceSynchronize());
  SB_CUDA_CHECK(cudaMemcpy(h, y + n - 4, sizeof h, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (bf16 b : h) bad += bits(b) != bits(__float2bfloat16(4 * v));
  report("to_bf16 n=2^31+4099 (tail)", Err{}, 0.0, bad);
}

// A failed allocation's error names the device's free memory and the keys that lower a rank's use.
void test_out_of_memory() {
  void* p = nullptr;
  std::string what;
  try {
    SB_CUDA_CHECK(cudaMalloc(&p, size_t(1) << 50));  // 1 PiB
  } catch (const sb::Error& e) {
    what = e.what();
  }
  const bool ok = what.find("cudaErrorMemoryAllocation") != std::string::npos &&
                  what.find("GiB free") != std::string::npos && what.find("train.recompute") != std::string::npos &&
                  cudaGetLastError() == cudaSuccess;
  std::printf("%-4s cudaMalloc(1 PiB): %s\n", ok ? "OK" : "FAIL", what.c_str());
  g_fails += !ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!C::device_available(&why)) {
    std::printf("SKIP: no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  for (int i = 1; i < argc; i++) g_quick |= std::strcmp(argv[i], "--quick") == 0;  // for compute-sanitizer
  std::random_device rd;
  const uint64_t seed = (uint64_t(rd()) << 32) ^ rd();
  std::printf("seed %llu%s\n", (unsigned long long)seed, g_quick ? " (quick)" : "");
  g_rng.seed(seed);
  const bool q = g_quick;
  try {
    SB_CUDA_CHECK(cudaStreamCreate(&g_stream));  // a real stream: checks every launcher honours it
    {
      C::Blas blas(g_stream);
      test_gemm(blas);
      test_linear(blas);
    }
    test_rmsnorm(q ? 300 : 700, 200);
    test_rmsnorm(q ? 20 : 97, 1024);
    test_rmsnorm(q ? 5 : 33, 4096);
    test_rope(q ? 64 : 300, 4, 64, 10000.0);
    test_rope(q ? 64 : 300, 3, 128, 500000.0);
    test_rope(q ? 64 : 300, 2, 128, 1000000.0, 1.1386);  // a scaled table with YaRN's attention factor
    test_swiglu(q ? 10007 : 100003);
    test_swiglu(q ? 10000 : 100000);  // a multiple of 8: the 16-byte kernels
    test_fused(q);
    test_embedding(1000, 96, q ? 200 : 777);
    test_embedding(500, 300, q ? 100 : 600);
    test_lora_dropout(q ? 10007 : 100003, 0.1);
    test_lora_dropout(q ? 10007 : 100003, 0.5);
    for (bool bf : {false, true}) {  // V 259, 1001: one logit a load; 1000, 32768, 151936: 16 bytes
      test_cross_entropy(q ? 16 : 64, 259, 0.0, 2.0, bf);
      test_cross_entropy(q ? 8 : 24, 1000, 1.0, 2.0, bf);
      test_cross_entropy(q ? 8 : 24, 1001, 1.0, 2.0, bf);
      test_cross_entropy(q ? 6 : 40, 32768, 100.0, 3.0, bf);  // large logits: needs the max subtraction
      if (!q) test_cross_entropy(6, 151936, -20.0, 4.0, bf);
      test_cross_entropy_nan(1001, bf);
      test_cross_entropy_nan(32768, bf);
    }
    test_adamw(q ? 10007 : 100003, 0.1f);
    test_adamw(q ? 10007 : 100003, 0.0f);
    test_misc(q ? 10007 : 1000003);
    if (!q) test_huge();
    if (!q) test_out_of_memory();  // not under compute-sanitizer (--quick): it reports the failed call
    SB_CUDA_CHECK(cudaStreamDestroy(g_stream));
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %d failure(s)\n", g_fails ? "FAILED" : "PASSED", g_fails);
  return g_fails ? 1 : 0;
}
