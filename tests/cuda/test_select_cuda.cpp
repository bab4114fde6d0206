// The selection built on the device (DeviceGating, kernels/cuda/select_device.cu) against the CPU
// reference: kernels::gate_blocks<double> on the same bf16 inputs, put on the device with
// DeviceSelection::upload (whose host code builds the transpose). Per case several layers with
// their own budgets k in one prepare(), documents packed, random scores with a per-block structure
// (so theta and k both bite) or exact ties. Checked: block table, CSR (row_ptr, cols), CSC (col_ptr,
// col_rows) identical; kept blocks and causal blocks equal, recall sums to rounding; both launch
// orders permutations equal to cta_order_bounded of the same work, with their list-schedule
// makespan against the host's mixed order; the attention forward on the device selection equal bit
// for bit to the one on the uploaded host selection, and the backward to rounding (its compacted
// grid bounded by the worst case reserve() sized, against the uploaded selection's kept blocks).
// Also true recall on the device (true_recall.cu) against the CPU's on sampled rows.
// Exit 0 all passed, 1 a failure, 77 no usable GPU (ctest SKIP).
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cta_order.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "tests/cuda/ops_check.hpp"  // compare

namespace K = sb::kernels;
namespace C = sb::kernels::cuda;
using C::bf16;

namespace {

struct Case {
  const char* name;
  int D, Bs, H, Hkv, local;
  double theta;
  std::vector<int> lens, budgets;  // documents; k per layer
  bool ties;
  K::GateQuery query = K::GateQuery::mean;  // the gate mode (attention.gate_query, gate_key, gate_sub_blocks)
  K::GateKey key = K::GateKey::mean;
  int sub = 4;
  K::GatingParams params(int k) const { return {k, local, theta, query, key, sub}; }
};

float bf_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

template <class T>
T* dalloc(size_t n) {
  T* p = nullptr;
  SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}
bf16* upload_bf16(const std::vector<double>& x) {
  std::vector<bf16> h(x.size());
  for (size_t i = 0; i < x.size(); i++) h[i] = __float2bfloat16(float(x[i]));
  bf16* d = dalloc<bf16>(h.size());
  SB_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  return d;
}

// q (N,H,D), k (N,Hkv,D) rounded to bf16; structured so that the pooled scores differ (or tie).
void inputs(const Case& c, const std::vector<int32_t>& cu, std::mt19937_64& rng, std::vector<double>& q,
            std::vector<double>& k) {
  std::normal_distribution<double> N01(0, 1);
  const int64_t N = cu.back();
  const int ndocs = int(cu.size()) - 1;
  q.assign(size_t(N) * c.H * c.D, 0), k.assign(size_t(N) * c.Hkv * c.D, 0);
  std::vector<double> qoff(c.D), koff(size_t(7) * c.D);
  for (auto& x : qoff) x = N01(rng);
  for (auto& x : koff) x = N01(rng);
  for (int64_t t = 0; t < N; t++)
    for (int h = 0; h < c.H; h++)
      for (int e = 0; e < c.D; e++) q[(t * c.H + h) * c.D + e] = bf_round(float(N01(rng) + qoff[e]));
  for (int d = 0; d < ndocs; d++)
    for (int64_t t = cu[d]; t < cu[d + 1]; t++) {
      const int blk = int((t - cu[d]) / c.Bs), pat = c.ties ? blk % 3 : int(rng() % 7);
      for (int g = 0; g < c.Hkv; g++)
        for (int e = 0; e < c.D; e++)
          k[(t * c.Hkv + g) * c.D + e] =
              c.ties ? bf_round(float(koff[size_t(pat) * c.D + e] + 0.25 * ((t - cu[d]) % c.Bs == 0)))
                     : bf_round(float(N01(rng) + 1.5 * koff[size_t(pat) * c.D + e]));
    }
}

// Work of each launch-order item, as DeviceSelection::upload computes it.
void work_of(const C::DeviceSelection::HostCopy& h, K::AttnShape s, std::vector<int64_t>& fw, std::vector<int64_t>& bw) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, G = H / Hkv;
  fw.assign(h.blocks.size() * H, 0), bw.assign(h.blocks.size() * Hkv, 0);
  for (size_t bi = 0; bi < h.blocks.size(); bi++) {
    const C::BlockInfo& b = h.blocks[bi];
    for (int g = 0; g < Hkv; g++) {
      const int64_t r = h.sel.doc_row_base[b.doc] + int64_t(g) * b.nb + b.i;
      for (int hh = g * G; hh < g * G + G; hh++) fw[bi * H + hh] = h.sel.row_ptr[r + 1] - h.sel.row_ptr[r];
      bw[bi * Hkv + g] = G * (h.col_ptr[r + 1] - h.col_ptr[r]);
    }
  }
}

bool is_permutation(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); i++)
    if (v[i] != int32_t(i)) return false;
  return true;
}

// One launch order: a permutation, equal to cta_order_bounded, makespan against the host's order.
bool check_order(const char* what, const std::vector<int32_t>& got, const std::vector<int32_t>& host,
                 const std::vector<int64_t>& work, int n_heads, int slots, double& ratio) {
  const bool perm = is_permutation(got) && got.size() == work.size();
  const bool same = got == K::cta_order_bounded(work, n_heads, slots);
  const double mh = K::list_makespan(work, host, slots), md = K::list_makespan(work, got, slots);
  ratio = mh > 0 ? md / mh : 1.0;
  if (!perm || !same) std::printf("    %s order: %s%s\n", what, perm ? "" : "not a permutation ", same ? "" : "differs from cta_order_bounded");
  return perm && same && ratio <= 1.10;
}

bool run_case(const Case& c, uint64_t seed, int slots) {
  std::mt19937_64 rng(seed);
  const K::AttnShape s{c.H, c.Hkv, c.D, c.Bs};
  const int ndocs = int(c.lens.size()), L = int(c.budgets.size());
  std::vector<int32_t> cu(ndocs + 1, 0);
  for (int d = 0; d < ndocs; d++) cu[d + 1] = cu[d] + c.lens[d];
  const int64_t N = cu[ndocs];
  std::vector<std::vector<double>> q(L), k(L);
  std::vector<bf16*> dq(L), dk(L);
  for (int l = 0; l < L; l++) {
    inputs(c, cu, rng, q[l], k[l]);
    dq[l] = upload_bf16(q[l]), dk[l] = upload_bf16(k[l]);
  }
  // the device path: one prepare, every layer's selection, the stats at the end
  C::DeviceGating gate;
  std::vector<C::DeviceSelection> dev(L);
  gate.prepare(cu.data(), ndocs, s, c.budgets, c.params(0));
  for (auto& d : dev) gate.reserve(d);
  for (int l = 0; l < L; l++) gate.select(dq[l], dk[l], l, dev[l]);
  gate.fetch_stats();
  SB_CUDA_CHECK(cudaDeviceSynchronize());

  bool ok = true;
  double worst_f = 0, worst_b = 0, density = 0, bwd_rel = 0;
  size_t bwd_bad = 0;  // non-finite gradients of either backward
  for (int l = 0; l < L; l++) {
    K::BlockSelection ref;
    const K::GatingStats sr =
        K::gate_blocks<double>(q[l].data(), k[l].data(), cu.data(), ndocs, s, c.params(c.budgets[l]), ref);
    C::DeviceSelection host;
    host.upload(ref, cu.data(), ndocs, s);
    const C::DeviceSelection::HostCopy h = host.download(ndocs), g = dev[l].download(ndocs);
    const K::GatingStats sg = gate.stats(l);
    const bool blocks_same = h.blocks.size() == g.blocks.size() &&
                             std::memcmp(h.blocks.data(), g.blocks.data(), h.blocks.size() * sizeof(C::BlockInfo)) == 0;
    const bool csr = h.sel.doc_row_base == g.sel.doc_row_base && h.sel.row_ptr == g.sel.row_ptr && h.sel.cols == g.sel.cols;
    const bool csc = h.col_ptr == g.col_ptr && h.col_rows == g.col_rows;
    const bool stats = sg.kept_blocks == sr.kept_blocks && sg.causal_blocks == sr.causal_blocks && sg.rows == sr.rows &&
                       std::fabs(sg.recall_sum - sr.recall_sum) <= 1e-6 * std::max(1.0, sr.rows);
    std::vector<int64_t> fw, bw;
    work_of(h, s, fw, bw);
    double rf = 1, rb = 1;
    const bool of = check_order("forward", g.fwd_items, h.fwd_items, fw, c.H, slots, rf);
    const bool ob = check_order("backward", g.bwd_items, h.bwd_items, bw, c.Hkv, slots, rb);
    worst_f = std::max(worst_f, rf), worst_b = std::max(worst_b, rb);
    density += sr.density() / L;
    // the attention forward reads the device selection as it reads the uploaded one
    bool fwd_same = true, bwd_same = true;
    if (l == L - 1) {
      std::vector<double> vh(size_t(N) * c.Hkv * c.D);
      std::normal_distribution<double> N01(0, 1);
      for (auto& x : vh) x = bf_round(float(N01(rng)));
      bf16* dv = upload_bf16(vh);
      bf16 *o1 = dalloc<bf16>(size_t(N) * c.H * c.D), *o2 = dalloc<bf16>(size_t(N) * c.H * c.D);
      float *l1 = dalloc<float>(size_t(N) * c.H), *l2 = dalloc<float>(size_t(N) * c.H);
      C::block_attention_fwd(dq[l], dk[l], dv, host, s, o1, l1);
      C::block_attention_fwd(dq[l], dk[l], dv, dev[l], s, o2, l2);
      std::vector<bf16> a(size_t(N) * c.H * c.D), b(a.size());
      std::vector<float> la(size_t(N) * c.H), lb(la.size());
      SB_CUDA_CHECK(cudaMemcpy(a.data(), o1, a.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
      SB_CUDA_CHECK(cudaMemcpy(b.data(), o2, b.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
      SB_CUDA_CHECK(cudaMemcpy(la.data(), l1, la.size() * sizeof(float), cudaMemcpyDeviceToHost));
      SB_CUDA_CHECK(cudaMemcpy(lb.data(), l2, lb.size() * sizeof(float), cudaMemcpyDeviceToHost));
      fwd_same = std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0 &&
                 std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0;
      // and the backward: the device selection's compacted grid is bounded by the worst case
      // reserve() sized, the uploaded one's by its kept blocks; split columns add dK, dV in fp32
      // in a varying order, so the two agree to rounding, not bit for bit
      const size_t nq = size_t(N) * c.H * c.D, nk = size_t(N) * c.Hkv * c.D;
      std::vector<double> doh(nq);
      for (auto& x : doh) x = bf_round(float(N01(rng)));
      bf16* ddo = upload_bf16(doh);
      void* ws = dalloc<unsigned char>(C::block_attention_bwd_workspace(N, s));
      std::vector<bf16*> grads;
      for (const C::DeviceSelection* sel : {&host, &dev[l]}) {
        bf16 *gq = dalloc<bf16>(nq), *gk = dalloc<bf16>(nk), *gv = dalloc<bf16>(nk);
        C::block_attention_bwd(dq[l], dk[l], dv, o1, l1, ddo, *sel, s, gq, gk, gv, ws);
        grads.insert(grads.end(), {gq, gk, gv});
      }
      SB_CUDA_CHECK(cudaDeviceSynchronize());
      for (int t = 0; t < 3; t++) {
        const size_t n = t == 0 ? nq : nk;
        std::vector<bf16> x(n), y(n);
        SB_CUDA_CHECK(cudaMemcpy(x.data(), grads[t], n * sizeof(bf16), cudaMemcpyDeviceToHost));
        SB_CUDA_CHECK(cudaMemcpy(y.data(), grads[3 + t], n * sizeof(bf16), cudaMemcpyDeviceToHost));
        std::vector<double> ref(n), got(n);
        for (size_t i = 0; i < n; i++) ref[i] = __bfloat162float(x[i]), got[i] = __bfloat162float(y[i]);
        const opcheck::Err e = opcheck::compare(got, ref);  // the uploaded selection's as the reference
        bwd_bad += e.bad;
        bwd_rel = std::max(bwd_rel, e.rel);
      }
      bwd_same = bwd_bad == 0 && bwd_rel <= 1e-2;
      for (bf16* p : grads) SB_CUDA_CHECK(cudaFree(p));
      SB_CUDA_CHECK(cudaFree(ddo));
      SB_CUDA_CHECK(cudaFree(ws));
      for (void* p : {(void*)dv, (void*)o1, (void*)o2, (void*)l1, (void*)l2}) SB_CUDA_CHECK(cudaFree(p));
    }
    const bool lok = blocks_same && csr && csc && stats && of && ob && fwd_same && bwd_same;
    if (!lok)
      std::printf("  layer %d k=%d: blocks %d CSR %d CSC %d stats %d (kept %.0f vs %.0f, recall %.6f vs %.6f) "
                  "orders %d %d (makespan x%.3f x%.3f) attention %d backward %d (rel %.1e)\n",
                  l, c.budgets[l], blocks_same, csr, csc, stats, sg.kept_blocks, sr.kept_blocks, sg.recall_sum,
                  sr.recall_sum, of, ob, rf, rb, fwd_same, bwd_same, bwd_rel);
    ok = ok && lok;
  }
  for (int l = 0; l < L; l++) {
    SB_CUDA_CHECK(cudaFree(dq[l]));
    SB_CUDA_CHECK(cudaFree(dk[l]));
  }
  std::printf("%-4s %-28s N %6lld layers %d density %.3f | CSR, CSC, stats identical; makespan vs host order "
              "fwd x%.3f bwd x%.3f (worst layer); backward vs uploaded rel %.1e\n",
              ok ? "OK" : "FAIL", c.name, (long long)N, L, density, worst_f, worst_b, bwd_rel);
  return ok;
}

}  // namespace

// True recall on the device (true_recall.cu) against kernels::true_recall<double> on the same bf16
// inputs and selection (gated on the host, uploaded), on sampled rows of packed documents.
bool check_true_recall(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const K::AttnShape s{c.H, c.Hkv, c.D, c.Bs};
  const int ndocs = int(c.lens.size());
  std::vector<int32_t> cu(ndocs + 1, 0);
  for (int d = 0; d < ndocs; d++) cu[d + 1] = cu[d] + c.lens[d];
  std::vector<double> q, k;
  inputs(c, cu, rng, q, k);
  K::BlockSelection sel;
  K::gate_blocks<double>(q.data(), k.data(), cu.data(), ndocs, s, {c.budgets[0], c.local, c.theta}, sel);
  const int64_t rows = sel.doc_row_base.back();
  std::vector<int64_t> pick;
  for (int n = 0; n < 64; n++) pick.push_back(int64_t(rng() % uint64_t(rows)));
  pick.push_back(rows - 1);
  std::vector<float> want(pick.size()), got(pick.size());
  K::true_recall<double>(q.data(), k.data(), cu.data(), ndocs, s, sel, pick.data(), int(pick.size()), want.data());
  bf16 *dq = upload_bf16(q), *dk = upload_bf16(k);
  C::DeviceSelection dsel;
  dsel.upload(sel, cu.data(), ndocs, s);
  C::true_recall(dq, dk, cu.data(), ndocs, s, dsel, pick.data(), int(pick.size()), got.data());
  SB_CUDA_CHECK(cudaFree(dq));
  SB_CUDA_CHECK(cudaFree(dk));
  double worst = 0;
  int below = 0;
  for (size_t i = 0; i < pick.size(); i++) worst = std::max(worst, std::abs(double(got[i]) - want[i])), below += want[i] < 0.99;
  const bool ok = worst < 2e-3 && below > 0;
  std::printf("  true recall %-28s %zu rows (%d below 0.99), max |cuda - cpu| %.2e %s\n", c.name, pick.size(), below, worst,
              ok ? "ok" : "FAIL");
  return ok;
}

int main(int argc, char** argv) {
  std::string why;
  if (!C::device_available(&why)) {
    std::printf("SKIP: no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;  // for compute-sanitizer: small cases
  int dev = 0, slots = 1;
  SB_CUDA_CHECK(cudaGetDevice(&dev));
  SB_CUDA_CHECK(cudaDeviceGetAttribute(&slots, cudaDevAttrMultiProcessorCount, dev));
  const std::vector<Case> cases = {
      {"D64 Bs64 GQA2 packed", 64, 64, 4, 2, 1, 4.0, {1200, 300, 64, 1, 777}, {0, 2, 5, 40}, false},
      {"D128 Bs128 GQA5 packed", 128, 128, 10, 2, 1, 8.0, {5000, 3000, 129}, {3, 8, 1}, false},
      {"D64 Bs64 MHA ties", 64, 64, 2, 2, 2, 100.0, {3000, 650}, {2, 7}, true},
      {"D128 Bs64 GQA2 long", 128, 64, 4, 2, 1, 8.0, {20000}, {16, 4}, false},
      {"D128 Bs128 GQA5 32K (0.47B)", 128, 128, 10, 2, 1, 8.0, {32768}, {8, 20}, false},
      // MHA on the wgmma kernels: kept unknown on the host, so the backward splits the sink columns
      {"D64 Bs128 MHA 9K", 64, 128, 4, 4, 1, 8.0, {9000, 2000}, {6, 12}, false},
      // the gate modes (kernels/README.md, "Gate modes")
      {"D64 Bs64 GQA2 query max", 64, 64, 4, 2, 1, 4.0, {1200, 300, 1}, {2, 5}, false, K::GateQuery::max},
      {"D128 Bs128 GQA5 key bounds", 128, 128, 10, 2, 1, 8.0, {3000, 129}, {3, 8}, false, K::GateQuery::mean,
       K::GateKey::bounds},
      {"D64 Bs64 MHA ties max+sub4", 64, 64, 2, 2, 2, 100.0, {2000, 650}, {2, 7}, true, K::GateQuery::max,
       K::GateKey::sub, 4},
      {"D128 Bs128 GQA5 8K max+bounds", 128, 128, 10, 2, 1, 8.0, {8192, 77}, {8, 4}, false, K::GateQuery::max,
       K::GateKey::bounds},
      // the per-token score stage (gate_score.cu): MHA, the 0.47B shape, a block's rows over two tiles
      {"D64 Bs64 MHA query max", 64, 64, 4, 4, 1, 4.0, {1500, 77, 900}, {3, 6}, false, K::GateQuery::max},
      {"D128 Bs128 GQA5 query max (0.47B)", 128, 128, 10, 2, 1, 8.0, {6000, 2000, 129}, {8, 20}, false,
       K::GateQuery::max},
      {"D64 Bs128 GQA3 max+sub128", 64, 128, 6, 2, 1, 8.0, {2100, 300}, {4, 2}, false, K::GateQuery::max,
       K::GateKey::sub, 128},
  };
  std::random_device rd;
  const uint64_t base = (uint64_t(rd()) << 32) ^ rd();
  std::printf("seed base %llu, %d SMs\n", (unsigned long long)base, slots);
  int fails = 0;
  try {
    for (size_t i = 0; i < (quick ? 3 : cases.size()); i++) fails += !run_case(cases[i], base + i, slots);
    for (size_t i = 0; i < (quick ? 2 : 3); i++) fails += !check_true_recall(cases[i], base + 100 + i);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %d failed\n", fails ? "FAIL" : "PASS", fails);
  return fails ? 1 : 0;
}
