// CUDA block-sparse attention (kernels/cuda) against the CPU kernels in double, on fresh random
// bf16 inputs: forward out/lse and backward dq/dk/dv, relative error ||gpu - ref|| / ||ref||.
// Outputs are poisoned with NaN before every run and checked fully written (no NaN left).
// Every case runs with both kernel generations where the wgmma ones run (block 128, sm_90a build on
// a 9.0 device; the report names the one used), else with mma.sync only.
// Cases: head_dim 64/128 x block 64/128, GQA and MHA, varlen documents with partial blocks, random
// selections (empty rows, rows without the diagonal), dense (every causal block) and CPU gating.
// Exit 0 all passed, 1 a failure, 77 no usable GPU (ctest SKIP).
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/kernels.hpp"

namespace K = sb::kernels;
namespace C = sb::kernels::cuda;
using C::bf16;

namespace {

constexpr double kTol = 1e-2;
bool g_wgmma = false;  // the wgmma kernels preferred (they run for block 128 only)

float bf_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

struct Case {
  const char* name;
  int D, Bs, H, Hkv;
  std::vector<int> lens;
  enum Sel { kRandom, kDense, kGate } sel;
};

void random_selection(const std::vector<int32_t>& cu, int ndocs, K::AttnShape s, std::mt19937_64& rng,
                      K::BlockSelection& sel) {
  std::uniform_real_distribution<double> U(0, 1);
  sel.doc_row_base.assign(ndocs + 1, 0);
  sel.row_ptr.assign(1, 0);
  sel.cols.clear();
  for (int d = 0; d < ndocs; d++) {
    const int nb = (cu[d + 1] - cu[d] + s.block_size - 1) / s.block_size;
    sel.doc_row_base[d + 1] = sel.doc_row_base[d] + int64_t(s.n_kv_heads) * nb;
    for (int g = 0; g < s.n_kv_heads; g++)
      for (int i = 0; i < nb; i++) {
        const bool empty = U(rng) < 0.05;
        for (int j = 0; j <= i && !empty; j++) {
          const bool keep = (j == i) ? U(rng) < 0.9 : (j == 0) ? U(rng) < 0.8 : U(rng) < 0.4;
          if (keep) sel.cols.push_back(j);
        }
        sel.row_ptr.push_back(int64_t(sel.cols.size()));
      }
  }
  sel.recall.assign(sel.doc_row_base[ndocs], 1.0f);
}

template <class T>
T* dalloc(size_t n) {
  T* p = nullptr;
  SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

std::vector<bf16> to_bf16(const std::vector<double>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = __float2bfloat16(float(x[i]));
  return y;
}

// rel error over finite reference entries; counts NaN in gpu output and inf mismatches as failures
struct Err {
  double rel = 0;
  size_t bad = 0;
};
Err compare(const std::vector<float>& gpu, const std::vector<double>& ref) {
  double num = 0, den = 0;
  Err e;
  for (size_t i = 0; i < ref.size(); i++) {
    const double g = gpu[i], r = ref[i];
    if (std::isnan(g)) { e.bad++; continue; }
    if (std::isinf(r) || std::isinf(g)) {
      if (!(std::isinf(r) && std::isinf(g) && (r > 0) == (g > 0))) e.bad++;
      continue;
    }
    num += (g - r) * (g - r);
    den += r * r;
  }
  e.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}
std::vector<float> from_dev_bf16(const bf16* d, size_t n) {
  std::vector<bf16> h(n);
  SB_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
  return f;
}

// The wgmma backward's compacted grid (set_bwd_compact) against the full grid, through the per-CTA
// trace (set_bwd_trace: [0] start, [1] end, 0 for a CTA that left without work, [3] its tiles): the
// compacted grid's working CTAs are its first ones, the same pieces with the same tiles in the same
// order as the full grid's working CTAs, and it is no larger. Runs the backward twice more.
bool same_pieces(const std::function<void()>& backward, const char* name) {
  constexpr int64_t kCtas = 1 << 16;
  unsigned long long* buf = dalloc<unsigned long long>(16 * kCtas);
  struct Run {
    std::vector<unsigned> tiles;  // the working CTAs' tiles, in grid order
    int64_t grid = 0, first_idle = -1, last_working = -1;
  };
  auto run = [&](bool compact) {
    SB_CUDA_CHECK(cudaMemset(buf, 0, 16 * kCtas * sizeof(unsigned long long)));
    C::set_bwd_compact(compact);
    C::set_bwd_trace(buf, kCtas);
    backward();
    C::set_bwd_trace(nullptr, 0);
    std::vector<unsigned long long> h(16 * kCtas);
    SB_CUDA_CHECK(cudaMemcpy(h.data(), buf, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    Run r;
    for (int64_t x = 0; x < kCtas; x++) {
      if (h[16 * x] == 0) continue;  // not launched
      r.grid = x + 1;
      if (h[16 * x + 1] != 0) {
        r.tiles.push_back(unsigned(h[16 * x + 3]));
        r.last_working = x;
      } else if (r.first_idle < 0) {
        r.first_idle = x;
      }
    }
    return r;
  };
  const Run full = run(false), comp = run(true);
  C::set_bwd_compact(true);
  SB_CUDA_CHECK(cudaFree(buf));
  const bool fits = full.grid < kCtas;
  const bool front = comp.first_idle < 0 || comp.first_idle > comp.last_working;
  const bool ok = fits && front && comp.tiles == full.tiles && comp.grid <= full.grid && !full.tiles.empty();
  if (!ok || full.grid > int64_t(full.tiles.size()))
    std::printf("%-4s pieces %-28s full grid %lld CTAs, %zu working | compacted %lld CTAs, %zu working%s%s%s\n",
                ok ? "OK" : "FAIL", name, (long long)full.grid, full.tiles.size(), (long long)comp.grid,
                comp.tiles.size(), fits ? "" : ", trace too small", front ? "" : ", idle CTAs among the working",
                comp.tiles == full.tiles ? "" : ", other pieces");
  return ok;
}

bool run_case(const Case& c, uint64_t seed, int rep) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> N01(0, 1);
  const K::AttnShape s{c.H, c.Hkv, c.D, c.Bs};
  const int ndocs = int(c.lens.size());
  std::vector<int32_t> cu(ndocs + 1, 0);
  for (int d = 0; d < ndocs; d++) cu[d + 1] = cu[d] + c.lens[d];
  const int64_t N = cu[ndocs];
  const size_t nq = size_t(N) * c.H * c.D, nk = size_t(N) * c.Hkv * c.D;
  // inputs rounded to bf16 so CPU and GPU see the same numbers
  auto rnd = [&](size_t n, double sd) {
    std::vector<double> x(n);
    for (auto& v : x) v = bf_round(float(N01(rng) * sd));
    return x;
  };
  std::vector<double> q = rnd(nq, 1.5), k = rnd(nk, 1.5), v = rnd(nk, 1.0), dout = rnd(nq, 1.0);

  K::BlockSelection sel;
  if (c.sel == Case::kDense) K::select_all_causal(cu.data(), ndocs, s, sel);
  else if (c.sel == Case::kGate) K::gate_blocks<double>(q.data(), k.data(), cu.data(), ndocs, s, {3, 1, 4.0}, sel);
  else random_selection(cu, ndocs, s, rng, sel);

  // CPU reference (double)
  std::vector<double> out_ref(nq), lse_ref(size_t(N) * c.H), dq_ref(nq), dk_ref(nk), dv_ref(nk);
  K::block_attention_fwd<double>(q.data(), k.data(), v.data(), cu.data(), ndocs, s, sel, out_ref.data(), lse_ref.data());
  K::block_attention_bwd<double>(q.data(), k.data(), v.data(), out_ref.data(), lse_ref.data(), dout.data(), cu.data(),
                                 ndocs, s, sel, dq_ref.data(), dk_ref.data(), dv_ref.data());

  // GPU
  C::DeviceSelection dsel;
  dsel.upload(sel, cu.data(), ndocs, s);
  bf16 *dq_in = dalloc<bf16>(nq), *dk_in = dalloc<bf16>(nk), *dv_in = dalloc<bf16>(nk), *ddo = dalloc<bf16>(nq);
  bf16 *dout_o = dalloc<bf16>(nq), *ddq = dalloc<bf16>(nq), *ddk = dalloc<bf16>(nk), *ddv = dalloc<bf16>(nk);
  float* dlse = dalloc<float>(size_t(N) * c.H);
  void* ws = dalloc<unsigned char>(C::block_attention_bwd_workspace(N, s));
  auto up = [](bf16* d, const std::vector<double>& h) {
    auto b = to_bf16(h);
    SB_CUDA_CHECK(cudaMemcpy(d, b.data(), b.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  };
  up(dq_in, q); up(dk_in, k); up(dv_in, v); up(ddo, dout);
  // poison: 0xFF bytes are NaN in both bf16 and fp32
  SB_CUDA_CHECK(cudaMemset(dout_o, 0xFF, nq * sizeof(bf16)));
  SB_CUDA_CHECK(cudaMemset(dlse, 0xFF, size_t(N) * c.H * sizeof(float)));
  SB_CUDA_CHECK(cudaMemset(ddq, 0xFF, nq * sizeof(bf16)));
  SB_CUDA_CHECK(cudaMemset(ddk, 0xFF, nk * sizeof(bf16)));
  SB_CUDA_CHECK(cudaMemset(ddv, 0xFF, nk * sizeof(bf16)));
  SB_CUDA_CHECK(cudaMemset(ws, 0xFF, C::block_attention_bwd_workspace(N, s)));
  C::block_attention_fwd(dq_in, dk_in, dv_in, dsel, s, dout_o, dlse);
  C::block_attention_bwd(dq_in, dk_in, dv_in, dout_o, dlse, ddo, dsel, s, ddq, ddk, ddv, ws);
  SB_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> lse(size_t(N) * c.H);
  SB_CUDA_CHECK(cudaMemcpy(lse.data(), dlse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const Err eo = compare(from_dev_bf16(dout_o, nq), out_ref), el = compare(lse, lse_ref);
  const Err eq = compare(from_dev_bf16(ddq, nq), dq_ref), ek = compare(from_dev_bf16(ddk, nk), dk_ref),
            ev = compare(from_dev_bf16(ddv, nk), dv_ref);
  bool ok = eo.bad + el.bad + eq.bad + ek.bad + ev.bad == 0 && eo.rel <= kTol && el.rel <= kTol &&
            eq.rel <= kTol && ek.rel <= kTol && ev.rel <= kTol;
  if (g_wgmma && c.Bs == 128)
    ok = same_pieces([&] { C::block_attention_bwd(dq_in, dk_in, dv_in, dout_o, dlse, ddo, dsel, s, ddq, ddk, ddv, ws); },
                     c.name) && ok;
  std::printf("%-4s %-5s %-28s rep %d N %6lld kept %7zu | rel err out %.2e lse %.2e dq %.2e dk %.2e dv %.2e | bad %zu\n",
              ok ? "OK" : "FAIL", g_wgmma && c.Bs == 128 ? "wgmma" : "mma", c.name, rep, (long long)N, sel.cols.size(), eo.rel, el.rel, eq.rel, ek.rel, ev.rel,
              eo.bad + el.bad + eq.bad + ek.bad + ev.bad);
  for (void* p : {(void*)dq_in, (void*)dk_in, (void*)dv_in, (void*)ddo, (void*)dout_o, (void*)ddq, (void*)ddk,
                  (void*)ddv, (void*)dlse, ws})
    SB_CUDA_CHECK(cudaFree(p));
  return ok;
}

// GPU gating against kernels::gate_blocks<double> on the same bf16 values: identical CSR, recall
// within 1e-6. `ties` makes blocks share identical keys (equal scores: the tie rule is exercised).
bool run_gating(const char* name, int D, int Bs, int H, int Hkv, std::vector<int> lens, K::GatingParams gp, bool ties,
                uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> N01(0, 1);
  const K::AttnShape s{H, Hkv, D, Bs};
  const int ndocs = int(lens.size());
  std::vector<int32_t> cu(ndocs + 1, 0);
  for (int d = 0; d < ndocs; d++) cu[d + 1] = cu[d] + lens[d];
  const int64_t N = cu[ndocs];
  std::vector<double> q(size_t(N) * H * D), k(size_t(N) * Hkv * D);
  // a per-block mean offset gives the scores structure (so theta and k both bite)
  std::vector<double> qoff(D), koff(size_t(7) * D);
  for (auto& x : qoff) x = N01(rng);
  for (auto& x : koff) x = N01(rng);
  for (int64_t t = 0; t < N; t++)
    for (int h = 0; h < H; h++)
      for (int e = 0; e < D; e++) q[(t * H + h) * D + e] = bf_round(float(N01(rng) + qoff[e]));
  for (int d = 0; d < ndocs; d++)
    for (int64_t t = cu[d]; t < cu[d + 1]; t++) {
      const int blk = int((t - cu[d]) / Bs), pat = ties ? blk % 3 : int(rng() % 7);
      for (int g = 0; g < Hkv; g++)
        for (int e = 0; e < D; e++)
          k[(t * Hkv + g) * D + e] =
              ties ? bf_round(float(koff[size_t(pat) * D + e] + 0.25 * ((t - cu[d]) % Bs == 0)))
                   : bf_round(float(N01(rng) + 1.5 * koff[size_t(pat) * D + e]));
    }
  K::BlockSelection ref, got;
  const K::GatingStats sr = K::gate_blocks<double>(q.data(), k.data(), cu.data(), ndocs, s, gp, ref);
  bf16 *dq = dalloc<bf16>(q.size()), *dk = dalloc<bf16>(k.size());
  {
    auto bq = to_bf16(q), bk = to_bf16(k);
    SB_CUDA_CHECK(cudaMemcpy(dq, bq.data(), bq.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    SB_CUDA_CHECK(cudaMemcpy(dk, bk.data(), bk.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  const K::GatingStats sg = C::gate_blocks(dq, dk, cu.data(), ndocs, s, gp, got);
  SB_CUDA_CHECK(cudaFree(dq));
  SB_CUDA_CHECK(cudaFree(dk));
  double rmax = 0;
  for (size_t r = 0; r < ref.recall.size() && r < got.recall.size(); r++)
    rmax = std::max(rmax, std::fabs(double(ref.recall[r]) - double(got.recall[r])));
  const bool same = ref.doc_row_base == got.doc_row_base && ref.row_ptr == got.row_ptr && ref.cols == got.cols &&
                    ref.recall.size() == got.recall.size();
  const bool ok = same && rmax <= 1e-6 && sr.kept_blocks == sg.kept_blocks;
  std::printf("%-4s gating %-22s N %6lld density %.3f recall %.4f | CSR %s, max |recall diff| %.1e\n", ok ? "OK" : "FAIL",
              name, (long long)N, sr.density(), sr.recall(), same ? "identical" : "DIFFERENT", rmax);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!C::device_available(&why)) {
    std::printf("SKIP: no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;  // for compute-sanitizer
  const std::vector<Case> cases = {
      {"D64 Bs64 GQA2 random", 64, 64, 4, 2, {200, 64, 1000, 37}, Case::kRandom},
      {"D128 Bs128 GQA4 random", 128, 128, 4, 1, {1300, 128, 555}, Case::kRandom},
      {"D128 Bs64 MHA dense", 128, 64, 2, 2, {700, 333}, Case::kDense},
      {"D64 Bs128 GQA3 random", 64, 128, 6, 2, {900, 5, 260}, Case::kRandom},
      // the Qwen2.5-0.5B grouping (7 query heads a KV head): the columns of 238 tiles are split
      {"D64 Bs128 GQA7 dense", 64, 128, 7, 1, {2100, 300}, Case::kDense},
      {"D128 Bs128 MHA dense", 128, 128, 2, 2, {1500, 129}, Case::kDense},
      {"D64 Bs64 GQA2 gated", 64, 64, 4, 2, {1200, 300}, Case::kGate},
      {"D128 Bs128 GQA2 gated", 128, 128, 4, 2, {2000, 700}, Case::kGate},
      {"D128 Bs64 GQA2 random", 128, 64, 4, 2, {513, 1024, 1}, Case::kRandom},
      {"D128 Bs128 GQA2 long random", 128, 128, 4, 2, {4100, 77}, Case::kRandom},
  };
  int fails = 0;
  const int reps = quick ? 1 : 2;
  std::random_device rd;
  const uint64_t base = (uint64_t(rd()) << 32) ^ rd();
  std::printf("seed base %llu\n", (unsigned long long)base);
  try {
    // both kernel generations where the wgmma one runs (block 128 on sm_90a); mma.sync everywhere
    for (const bool wg : {true, false}) {
      if (wg && !C::wgmma_attention_available()) {
        std::printf("wgmma kernels: not available here (not an sm_90a build on a 9.0 device)\n");
        continue;
      }
      C::prefer_wgmma_attention(wg);
      g_wgmma = wg;
      for (int rep = 0; rep < reps; rep++)
        for (size_t i = 0; i < cases.size(); i++) {
          if (quick && i % 2 == 1) continue;
          fails += !run_case(cases[i], base + 1000 * rep + i, rep);
        }
    }
    // the wgmma backward's column split: never, and chunks of 3 and 16 tiles (the automatic choice
    // does not split columns this short), on the block-128 cases
    if (C::wgmma_attention_available()) {
      C::prefer_wgmma_attention(true);
      g_wgmma = true;
      // split columns cut at their query heads and launched in windows of the SMs' items
      for (const int chunk : {0, 3, 16}) {
        C::set_bwd_column_chunk(chunk);
        std::printf("column split: chunk %d tiles\n", chunk);
        for (size_t i = 0; i < cases.size(); i++)
          if (cases[i].Bs == 128 && !(quick && chunk == 16))
            fails += !run_case(cases[i], base + 5000 + 100 * chunk + 50 + i, 0);
      }
      C::set_bwd_column_chunk(-1);
    }
    C::prefer_wgmma_attention(true);
    fails += !run_gating("D128 Bs128 GQA4 k3 w1", 128, 128, 8, 2, {3000, 700, 64, 1}, {3, 1, 4.0}, false, base + 77);
    fails += !run_gating("D64 Bs64 MHA k8 w2 th1", 64, 64, 4, 4, {2500, 130}, {8, 2, 1.0}, false, base + 78);
    fails += !run_gating("D64 Bs64 ties k2 w0", 64, 64, 2, 1, {4000}, {2, 0, 1e9}, true, base + 79);
    fails += !run_gating("D128 Bs64 k0 w0 th0.5", 128, 64, 4, 2, {1500, 900}, {0, 0, 0.5}, false, base + 80);
    if (!quick) fails += !run_gating("D128 Bs128 long k16", 128, 128, 4, 1, {40000}, {16, 1, 2.0}, false, base + 81);
    // the gate modes: per-token query, bounds and sub-block keys, each alone and together
    using GQ = K::GateQuery;
    using GK = K::GateKey;
    fails += !run_gating("max D128 Bs128 GQA4", 128, 128, 8, 2, {3000, 700, 64, 1}, {3, 1, 4.0, GQ::max}, false, base + 82);
    fails += !run_gating("bounds D64 Bs64 MHA", 64, 64, 4, 4, {2500, 130}, {8, 2, 1.0, GQ::mean, GK::bounds}, false, base + 83);
    fails += !run_gating("sub4 D128 Bs64 GQA2", 128, 64, 4, 2, {1500, 900, 3}, {4, 1, 2.0, GQ::mean, GK::sub, 4}, false, base + 84);
    fails += !run_gating("max+bounds ties", 64, 64, 2, 1, {4000}, {2, 0, 1e9, GQ::max, GK::bounds}, true, base + 85);
    fails += !run_gating("max+sub8 D128 Bs128", 128, 128, 4, 1, {5000, 77}, {6, 1, 3.0, GQ::max, GK::sub, 8}, false, base + 86);
    // the per-token score stage (gate_score.cu) over shapes: MHA and GQA 5 and 7, head dims 64 and
    // 128, blocks 64 and 128, uneven documents (partial last blocks, partial vector tiles), a key
    // block's rows over two column tiles (sub 128)
    fails += !run_gating("max D64 Bs64 MHA", 64, 64, 4, 4, {2500, 130, 1, 700}, {8, 2, 1.0, GQ::max}, false, base + 87);
    fails += !run_gating("max D128 Bs64 GQA5", 128, 64, 10, 2, {1500, 900, 3, 4100}, {4, 1, 2.0, GQ::max}, false, base + 88);
    fails += !run_gating("max+bounds D128 Bs128 MHA", 128, 128, 2, 2, {3000, 129, 77}, {5, 1, 4.0, GQ::max, GK::bounds},
                         false, base + 89);
    fails += !run_gating("max+sub4 D64 Bs128 GQA7", 64, 128, 7, 1, {2101, 300}, {6, 1, 3.0, GQ::max, GK::sub, 4}, false,
                         base + 90);
    fails += !run_gating("max+sub128 D64 Bs128 GQA2", 64, 128, 4, 2, {1000, 300}, {3, 1, 4.0, GQ::max, GK::sub, 128},
                         false, base + 91);
    fails += !run_gating("max+bounds D64 Bs64 GQA3", 64, 64, 6, 2, {1800, 65}, {4, 0, 2.0, GQ::max, GK::bounds}, false,
                         base + 92);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
  return fails ? 1 : 0;
}
