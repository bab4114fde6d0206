// Tokens/s of one training micro-batch step (forward + backward + AdamW) on one rank, for two
// model sizes, dense and sparse attention. Run with OPENBLAS_NUM_THREADS=1 (one rank per core).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <random>

#include "src/model/model.hpp"
#include "src/engine/update.hpp"

using namespace sb;

namespace {

ModelDims dims_for(int size) {
  ModelDims d;
  if (size == 0) {  // the demo model (configs/tiny.toml)
    d.n_layers = 2, d.d_model = 64, d.n_heads = 4, d.n_kv_heads = 2, d.ffn_dim = 192;
  } else {          // a larger CPU model (configs/small.toml)
    d.n_layers = 4, d.d_model = 256, d.n_heads = 8, d.n_kv_heads = 4, d.ffn_dim = 768;
  }
  d.head_dim = d.d_model / d.n_heads;
  d.vocab = 259;
  return d;
}

// args: model size (0 tiny, 1 small), sparse (0/1), tokens
void BM_TrainStep(benchmark::State& state) {
  ModelDims d = dims_for(int(state.range(0)));
  const bool sparse = state.range(1) != 0;
  const int n = int(state.range(2));
  Model<float> m(d);
  m.init(1);
  OptimSettings o{1e-3, 0.1, 0.1, 0.9, 0.95, 1e-8, 1.0, 10, 1000};
  AdamW opt(o, m.weights().size());
  std::mt19937_64 rng(3);
  PackedBatch b;  // a long-tail micro-batch: one long document and several short ones
  std::vector<int> lens = {n / 2, n / 4, n / 8, n / 8};
  for (int L : lens) {
    std::vector<uint32_t> seq(static_cast<size_t>(L));
    for (auto& t : seq) t = uint32_t(rng() % 256);
    b.add(seq);
  }
  AttnSettings a;
  a.sparse = sparse, a.block_size = 64, a.local_blocks = 1, a.theta = 8;
  a.k.assign(size_t(d.n_layers), 4);
  int64_t step = 0;
  double density = 0;
  for (auto _ : state) {
    m.zero_grads();
    auto st = m.forward_backward(b, a, 1.0f / float(n));
    opt.step(m, m.grads(), global_norm(m.grads()), 1e-3, ++step);
    density = st.gating[0].density();
  }
  state.SetItemsProcessed(state.iterations() * b.n());
  state.counters["tok/s"] = benchmark::Counter(double(b.n()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params"] = double(d.num_params());
  state.counters["density"] = density;
}
BENCHMARK(BM_TrainStep)->ArgsProduct({{0, 1}, {0, 1}, {4096}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  MPI_Finalize();
  return 0;
}
