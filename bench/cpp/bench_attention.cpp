// Block-sparse attention forward+backward time against density, and the cost of gating, at one
// long document: L=4096, H=Hkv=4, D=64, block 64, float. Run in Release with OPENBLAS_NUM_THREADS=1:
//   OPENBLAS_NUM_THREADS=1 ./bench_attention --benchmark_min_time=2
// Density d keeps, per query block i: block 0, block i and round(d*(i+1)) - 2 random other blocks.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.hpp"

namespace k = sb::kernels;

namespace {

const int L = 4096;
const k::AttnShape S{4, 4, 64, 64};

struct Problem {
  std::vector<int32_t> cu = {0, L};
  std::vector<float> q, kk, v, out, lse, dout, dq, dk, dv;
  Problem() {
    std::mt19937_64 gen(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, size_t n) {
      x.resize(n);
      for (auto& e : x) e = nd(gen);
    };
    const size_t nq = size_t(L) * S.n_heads * S.head_dim, nk = size_t(L) * S.n_kv_heads * S.head_dim;
    fill(q, nq), fill(kk, nk), fill(v, nk), fill(dout, nq);
    out.resize(nq), dq.resize(nq), dk.resize(nk), dv.resize(nk), lse.resize(size_t(L) * S.n_heads);
  }
};

Problem& problem() {
  static Problem p;
  return p;
}

// Rows for one document, kv head by kv head: {0, i} plus random others up to round(density*(i+1)).
k::BlockSelection selection(double density) {
  k::BlockSelection sel;
  if (density >= 1.0) {
    k::select_all_causal(problem().cu.data(), 1, S, sel);
    return sel;
  }
  const int nb = L / S.block_size;
  std::mt19937_64 gen(11);
  sel.doc_row_base = {0, int64_t(S.n_kv_heads) * nb};
  sel.row_ptr = {0};
  for (int g = 0; g < S.n_kv_heads; g++)
    for (int i = 0; i < nb; i++) {
      std::vector<int32_t> others(std::max(0, i - 1));  // 1 .. i-1
      std::iota(others.begin(), others.end(), 1);
      std::shuffle(others.begin(), others.end(), gen);
      int extra = std::clamp(int(std::lround(density * (i + 1))) - 2, 0, int(others.size()));
      std::vector<int32_t> row = {0};
      if (i > 0) row.push_back(i);
      row.insert(row.end(), others.begin(), others.begin() + extra);
      std::sort(row.begin(), row.end());
      sel.cols.insert(sel.cols.end(), row.begin(), row.end());
      sel.row_ptr.push_back(int64_t(sel.cols.size()));
      sel.recall.push_back(1.0f);
    }
  return sel;
}

// FLOPs of the tile gemms: forward 2 (QK^T, PV), backward 5 (QK^T, dO V^T, dS K, dS^T Q, P^T dO),
// each 2*Bs*Bs*D per kept tile and query head (diagonal tiles counted whole, as the gemm runs them).
double tile_flops(const k::BlockSelection& sel, int gemms) {
  return double(sel.cols.size()) * (S.n_heads / S.n_kv_heads) * gemms * 2.0 * S.block_size * S.block_size *
         S.head_dim;
}

void set_counters(benchmark::State& st, const k::BlockSelection& sel, int gemms) {
  const int nb = L / S.block_size;
  const double causal = double(S.n_kv_heads) * nb * (nb + 1) / 2;
  st.counters["density"] = double(sel.cols.size()) / causal;
  st.counters["kept_blocks"] = double(sel.cols.size());
  st.counters["FLOP/s"] = benchmark::Counter(tile_flops(sel, gemms), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionFwdBwd(benchmark::State& st) {
  Problem& p = problem();
  const k::BlockSelection sel = selection(st.range(0) / 100.0);
  for (auto _ : st) {
    k::block_attention_fwd<float>(p.q.data(), p.kk.data(), p.v.data(), p.cu.data(), 1, S, sel, p.out.data(),
                                  p.lse.data());
    k::block_attention_bwd<float>(p.q.data(), p.kk.data(), p.v.data(), p.out.data(), p.lse.data(), p.dout.data(),
                                  p.cu.data(), 1, S, sel, p.dq.data(), p.dk.data(), p.dv.data());
    benchmark::DoNotOptimize(p.dq.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, sel, 7);
}

void BM_AttentionFwd(benchmark::State& st) {
  Problem& p = problem();
  const k::BlockSelection sel = selection(st.range(0) / 100.0);
  for (auto _ : st) {
    k::block_attention_fwd<float>(p.q.data(), p.kk.data(), p.v.data(), p.cu.data(), 1, S, sel, p.out.data(),
                                  p.lse.data());
    benchmark::DoNotOptimize(p.out.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, sel, 2);
}

// Gating at the same size (budget k=8 besides anchors, w=1, theta=2), one argument per gate mode
// (attention.gate_query / gate_key): 0 mean/mean (the default), 1 max/mean, 2 mean/bounds,
// 3 mean/sub (4 sub-blocks), 4 max/bounds, 5 max/sub.
void BM_Gating(benchmark::State& st) {
  Problem& p = problem();
  k::BlockSelection sel;
  k::GatingStats gs;
  using Q = k::GateQuery;
  using K = k::GateKey;
  static const std::pair<Q, K> kModes[] = {{Q::mean, K::mean}, {Q::max, K::mean}, {Q::mean, K::bounds},
                                           {Q::mean, K::sub},  {Q::max, K::bounds}, {Q::max, K::sub}};
  const auto [qm, km] = kModes[st.range(0)];
  const k::GatingParams gp{8, 1, 2.0, qm, km, 4};
  st.SetLabel(std::string(qm == Q::max ? "query=max" : "query=mean") +
              (km == K::mean ? " key=mean" : km == K::bounds ? " key=bounds" : " key=sub/4"));
  for (auto _ : st) {
    gs = k::gate_blocks<float>(p.q.data(), p.kk.data(), p.cu.data(), 1, S, gp, sel);
    benchmark::DoNotOptimize(sel.cols.data());
  }
  st.counters["density"] = gs.density();
  st.counters["recall"] = gs.recall();
}

}  // namespace

// With --benchmark_repetitions=N the "_min" rows are the least disturbed by other load on the machine.
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
BENCHMARK(BM_AttentionFwdBwd)->Arg(100)->Arg(50)->Arg(25)->Arg(10)->Unit(benchmark::kMillisecond)->ComputeStatistics("min", min_of);
BENCHMARK(BM_AttentionFwd)->Arg(100)->Arg(50)->Arg(25)->Arg(10)->Unit(benchmark::kMillisecond)->ComputeStatistics("min", min_of);
BENCHMARK(BM_Gating)->DenseRange(0, 5)->Unit(benchmark::kMillisecond)->ComputeStatistics("min", min_of);

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
