// The fused elementwise kernels (kernels/cuda/fused.cu) against the CPU kernels of the chains they
// replace, and bitwise against the unfused GPU chains where the arithmetic is the same (the A/B of
// the model's fused path must differ only by summation order elsewhere). Part of test_ops_cuda (its main calls
// test_fused).
#include "tests/cuda/ops_check.hpp"

using namespace opcheck;

namespace {

void test_fused_rmsnorm(int N, int Cc) {
  const size_t n = size_t(N) * Cc;
  const double eps = 1e-5;
  char name[128];
  // forward: xm = g (a GEMM's output) + x, y = rmsnorm(xm) * w
  std::vector<double> x = randn(n, 1.5, 0.3, false), g = randn(n, 0.7, -0.1, false), w = randn(Cc, 0.2, 1.0, false);
  std::vector<double> xm(n), y(n), rstd(N);
  for (size_t i = 0; i < n; i++) xm[i] = double(float(x[i]) + float(g[i]));  // the fp32 add, as the GPU
  K::rmsnorm_fwd<double>(xm.data(), w.data(), y.data(), rstd.data(), N, Cc, eps);
  Dev<float> dx_in(to_f(x)), dxm(to_f(g)), dw(to_f(w)), drstd(N), drstd2(N);
  Dev<bf16> dy(n), dy2(n);
  dy.poison();
  drstd.poison();
  C::add_rmsnorm_fwd(dxm.p, dx_in.p, dw.p, dy.p, drstd.p, N, Cc, float(eps), g_stream);
  std::snprintf(name, sizeof name, "add_rmsnorm_fwd N%d C%d xm", N, Cc);
  report(name, compare(to_d(dxm.down()), xm), kTolF32);
  std::snprintf(name, sizeof name, "add_rmsnorm_fwd N%d C%d y", N, Cc);
  const std::vector<bf16> yf = dy.down();
  report(name, compare(to_d(yf), y), kTolBf16);
  std::snprintf(name, sizeof name, "add_rmsnorm_fwd N%d C%d rstd", N, Cc);
  report(name, compare(to_d(drstd.down()), rstd), kTolF32);
  C::rmsnorm_fwd(dxm.p, dw.p, dy2.p, drstd2.p, N, Cc, float(eps), g_stream);  // unfused, on the fused xm
  std::snprintf(name, sizeof name, "add_rmsnorm_fwd N%d C%d y == unfused", N, Cc);
  report(name, Err{}, 0, bits_differ(yf, dy2.down()));

  // backward onto random dx, dw; with and without dx16
  std::vector<double> rs(N);
  for (int t = 0; t < N; t++) rs[t] = float(rstd[t]);
  for (int with16 = 0; with16 < 2; with16++) {
    std::vector<double> dyv = randn(n, 1.0, 0.0, false), dx = randn(n, 1.0, 0.0, false), dwv = randn(Cc, 1.0, 0.0, false);
    Dev<float> ddy(to_f(dyv)), ddx(to_f(dx)), ddw(to_f(dwv)), drs(to_f(rs)), dxm2(to_f(xm));
    Dev<bf16> d16(n);
    d16.poison();
    K::rmsnorm_bwd<double>(xm.data(), w.data(), rs.data(), dyv.data(), dx.data(), dwv.data(), N, Cc);
    C::rmsnorm_bwd_fused(dxm2.p, dw.p, drs.p, ddy.p, ddx.p, with16 ? d16.p : nullptr, ddw.p, N, Cc, g_stream);
    std::snprintf(name, sizeof name, "rmsnorm_bwd_fused N%d C%d%s dx", N, Cc, with16 ? " +bf16" : "");
    const std::vector<float> dxg = ddx.down();
    report(name, compare(to_d(dxg), dx), kTolF32);
    std::snprintf(name, sizeof name, "rmsnorm_bwd_fused N%d C%d%s dw", N, Cc, with16 ? " +bf16" : "");
    report(name, compare(to_d(ddw.down()), dwv), kTolF32);
    if (!with16) continue;
    std::vector<bf16> want(n);
    for (size_t i = 0; i < n; i++) want[i] = __float2bfloat16(dxg[i]);
    std::snprintf(name, sizeof name, "rmsnorm_bwd_fused N%d C%d dx16 == bf16(dx)", N, Cc);
    report(name, compare(to_d(d16.down()), dx), kTolBf16, bits_differ(d16.down(), want));
  }
}

void test_fused_rope(int N, int H, int Hkv, int D, double theta, bool bias) {
  std::vector<int32_t> pos(N);
  std::uniform_int_distribution<int> P(0, 70000);
  for (auto& p : pos) p = P(g_rng);
  Dev<int32_t> dpos(pos);
  const size_t nq = size_t(N) * H * D, nk = size_t(N) * Hkv * D;
  char name[128];
  std::vector<double> q = randn(nq, 1.0), k = randn(nk, 1.0), v = randn(nk, 1.0);
  std::vector<double> bq = randn(H * D, 0.5, 0.0, false), bk = randn(Hkv * D, 0.5, 0.0, false),
                      bv = randn(Hkv * D, 0.5, 0.0, false);
  Dev<bf16> dq(to_b(q)), dk(to_b(k)), dv(to_b(v)), uq(to_b(q)), uk(to_b(k)), uv(to_b(v));
  Dev<float> dbq(to_f(bq)), dbk(to_f(bk)), dbv(to_f(bv));
  if (bias) {  // the GPU rounds x + b to bf16 before rotating (bias_add_fwd writes bf16)
    K::bias_add_fwd<double>(q.data(), bq.data(), N, H * D);
    K::bias_add_fwd<double>(k.data(), bk.data(), N, Hkv * D);
    K::bias_add_fwd<double>(v.data(), bv.data(), N, Hkv * D);
    for (auto* a : {&q, &k, &v})
      for (auto& e : *a) e = bfr(e);
  }
  K::rope_fwd<double>(q.data(), pos.data(), N, H, D, theta);
  K::rope_fwd<double>(k.data(), pos.data(), N, Hkv, D, theta);
  C::qkv_rope_fwd(dq.p, dk.p, dv.p, bias ? dbq.p : nullptr, bias ? dbk.p : nullptr, bias ? dbv.p : nullptr, dpos.p, N,
                  H, Hkv, D, theta, g_stream);
  if (bias) {  // the unfused chain on the same inputs
    C::bias_add_fwd(uq.p, dbq.p, N, H * D, g_stream);
    C::bias_add_fwd(uk.p, dbk.p, N, Hkv * D, g_stream);
    C::bias_add_fwd(uv.p, dbv.p, N, Hkv * D, g_stream);
  }
  C::rope_fwd(uq.p, dpos.p, N, H, D, theta, g_stream);
  C::rope_fwd(uk.p, dpos.p, N, Hkv, D, theta, g_stream);
  const char* b = bias ? " +bias" : "";
  std::snprintf(name, sizeof name, "qkv_rope_fwd N%d H%d/%d D%d%s q", N, H, Hkv, D, b);
  report(name, compare(to_d(dq.down()), q), kTolBf16, bits_differ(dq.down(), uq.down()));
  std::snprintf(name, sizeof name, "qkv_rope_fwd N%d H%d/%d D%d%s k", N, H, Hkv, D, b);
  report(name, compare(to_d(dk.down()), k), kTolBf16, bits_differ(dk.down(), uk.down()));
  std::snprintf(name, sizeof name, "qkv_rope_fwd N%d H%d/%d D%d%s v", N, H, Hkv, D, b);
  report(name, compare(to_d(dv.down()), v), bias ? kTolBf16 : 0.0, bits_differ(dv.down(), uv.down()));
  // backward: the inverse rotation of dq and dk
  std::vector<double> gq = randn(nq, 1.0), gk = randn(nk, 1.0);
  Dev<bf16> dgq(to_b(gq)), dgk(to_b(gk)), ugq(to_b(gq)), ugk(to_b(gk));
  K::rope_bwd<double>(gq.data(), pos.data(), N, H, D, theta);
  K::rope_bwd<double>(gk.data(), pos.data(), N, Hkv, D, theta);
  C::qk_rope_bwd(dgq.p, dgk.p, dpos.p, N, H, Hkv, D, theta, g_stream);
  C::rope_bwd(ugq.p, dpos.p, N, H, D, theta, g_stream);
  C::rope_bwd(ugk.p, dpos.p, N, Hkv, D, theta, g_stream);
  std::snprintf(name, sizeof name, "qk_rope_bwd N%d H%d/%d D%d dq", N, H, Hkv, D);
  report(name, compare(to_d(dgq.down()), gq), kTolBf16, bits_differ(dgq.down(), ugq.down()));
  std::snprintf(name, sizeof name, "qk_rope_bwd N%d H%d/%d D%d dk", N, H, Hkv, D);
  report(name, compare(to_d(dgk.down()), gk), kTolBf16, bits_differ(dgk.down(), ugk.down()));
}

// Packed rows (the packed projections): column blocks [0, w0), [w0, w0 + w1), ... of a (N, sum w) array, from and
// to separate (N, w) arrays.
std::vector<bf16> pack_rows(const std::vector<const std::vector<bf16>*>& parts, int N) {
  std::vector<bf16> out;
  for (int t = 0; t < N; t++)
    for (const auto* a : parts) {
      const size_t w = a->size() / size_t(N);
      out.insert(out.end(), a->begin() + long(t * w), a->begin() + long((t + 1) * w));
    }
  return out;
}

// qkv_rope_unpack_fwd / qkv_rope_pack_bwd against the separate-array kernels (bitwise: the same
// arithmetic on the same values), and the bias gradient of a packed column block against the CPU.
void test_packed_rope(int N, int H, int Hkv, int D, double theta, bool bias) {
  std::vector<int32_t> pos(N);
  std::uniform_int_distribution<int> P(0, 70000);
  for (auto& p : pos) p = P(g_rng);
  Dev<int32_t> dpos(pos);
  const int HD = H * D, KD = Hkv * D, P3 = HD + 2 * KD;
  const size_t nq = size_t(N) * HD, nk = size_t(N) * KD;
  char name[128];
  const char* b = bias ? " +bias" : "";
  const std::vector<bf16> q = to_b(randn(nq, 1.0)), k = to_b(randn(nk, 1.0)), v = to_b(randn(nk, 1.0));
  const std::vector<double> bq = randn(HD, 0.5, 0.0, false), bk = randn(KD, 0.5, 0.0, false),
                            bv = randn(KD, 0.5, 0.0, false);
  Dev<float> dbq(to_f(bq)), dbk(to_f(bk)), dbv(to_f(bv));
  Dev<bf16> packed(pack_rows({&q, &k, &v}, N)), oq(nq), ok(nk), ov(nk), sq(q), sk(k), sv(v);
  oq.poison(), ok.poison(), ov.poison();
  C::qkv_rope_unpack_fwd(packed.p, oq.p, ok.p, ov.p, bias ? dbq.p : nullptr, bias ? dbk.p : nullptr,
                         bias ? dbv.p : nullptr, dpos.p, N, H, Hkv, D, theta, g_stream);
  C::qkv_rope_fwd(sq.p, sk.p, sv.p, bias ? dbq.p : nullptr, bias ? dbk.p : nullptr, bias ? dbv.p : nullptr, dpos.p, N,
                  H, Hkv, D, theta, g_stream);
  std::snprintf(name, sizeof name, "qkv_rope_unpack_fwd N%d H%d/%d D%d%s == in place", N, H, Hkv, D, b);
  report(name, Err{}, 0,
         bits_differ(oq.down(), sq.down()) + bits_differ(ok.down(), sk.down()) + bits_differ(ov.down(), sv.down()));
  // backward: dq, dk rotated back and dv copied into one packed (N, P3) array
  const std::vector<bf16> gq = to_b(randn(nq, 1.0)), gk = to_b(randn(nk, 1.0)), gv = to_b(randn(nk, 1.0));
  Dev<bf16> dgq(gq), dgk(gk), dgv(gv), dqkv(size_t(N) * P3), ugq(gq), ugk(gk);
  dqkv.poison();
  C::qkv_rope_pack_bwd(dgq.p, dgk.p, dgv.p, dqkv.p, dpos.p, N, H, Hkv, D, theta, g_stream);
  C::qk_rope_bwd(ugq.p, ugk.p, dpos.p, N, H, Hkv, D, theta, g_stream);
  const std::vector<bf16> uq = ugq.down(), uk = ugk.down(), want = pack_rows({&uq, &uk, &gv}, N);
  std::snprintf(name, sizeof name, "qkv_rope_pack_bwd N%d H%d/%d D%d == in place", N, H, Hkv, D);
  const std::vector<bf16> got = dqkv.down();
  report(name, Err{}, 0, bits_differ(got, want));
  // bias gradients of the packed array's column blocks (rows P3 apart) onto random values
  const std::vector<double> dd = to_d(got);
  int at = 0;
  for (const int w : {HD, KD, KD}) {
    std::vector<double> block(size_t(N) * w), db = randn(w, 1.0, 0.0, false);
    for (int t = 0; t < N; t++)
      for (int c = 0; c < w; c++) block[size_t(t) * w + c] = dd[size_t(t) * P3 + at + c];
    Dev<float> ddb(to_f(db));
    K::bias_add_bwd<double>(block.data(), db.data(), N, w);
    C::bias_add_bwd(dqkv.p + at, ddb.p, N, w, g_stream, P3);
    std::snprintf(name, sizeof name, "bias_add_bwd N%d cols %d..%d of %d", N, at, at + w, P3);
    report(name, compare(to_d(ddb.down()), db), kTolF32);
    at += w;
  }
}

// swiglu_fwd/bwd_packed on (N, 2F) gate|up against the scalar kernels on the separate halves
// (bitwise); F % 8 != 0 takes the packed scalar kernels.
void test_packed_swiglu(int N, int F) {
  const size_t n = size_t(N) * F;
  char name[128];
  const std::vector<bf16> g = to_b(randn(n, 1.5)), u = to_b(randn(n, 1.0)), dh = to_b(randn(n, 1.0));
  Dev<bf16> gu(pack_rows({&g, &u}, N)), h(n), dgu(2 * n), sg(g), su(u), sdh(dh), sh(n), sdg(n), sdu(n), pdh(dh);
  h.poison(), dgu.poison();
  C::swiglu_fwd_packed(gu.p, h.p, N, F, g_stream);
  C::swiglu_bwd_packed(gu.p, pdh.p, dgu.p, N, F, g_stream);
  C::swiglu_fwd(sg.p, su.p, sh.p, n, g_stream);
  C::swiglu_bwd(sg.p, su.p, sdh.p, sdg.p, sdu.p, n, g_stream);
  const std::vector<bf16> wg = sdg.down(), wu = sdu.down();
  std::snprintf(name, sizeof name, "swiglu_fwd/bwd_packed N%d F%d == scalar", N, F);
  report(name, Err{}, 0, bits_differ(h.down(), sh.down()) + bits_differ(dgu.down(), pack_rows({&wg, &wu}, N)));
}

}  // namespace

void test_fused(bool q) {
  test_fused_rmsnorm(q ? 300 : 700, 200);
  test_fused_rmsnorm(q ? 40 : 2000, 1280);  // more rows than CTAs: rows strided
  test_fused_rmsnorm(q ? 5 : 33, 4096);
  test_fused_rmsnorm(q ? 3 : 9, 8192);      // over the shared-memory bound: the unfused chain
  test_fused_rope(q ? 64 : 300, 10, 2, 128, 500000.0, false);
  test_fused_rope(q ? 64 : 300, 14, 2, 64, 1000000.0, true);
  test_packed_rope(q ? 64 : 300, 10, 2, 128, 500000.0, false);
  test_packed_rope(q ? 64 : 300, 14, 2, 64, 1000000.0, true);
  test_packed_swiglu(q ? 37 : 300, 4864 / 8);  // 608: the 16-byte kernels
  test_packed_swiglu(q ? 37 : 300, 77);        // scalar
}
