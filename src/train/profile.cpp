#include "src/train/profile.hpp"

#include <algorithm>
#include <chrono>
#include <random>

#include "src/engine/engine.hpp"
#include "src/engine/update.hpp"

namespace sb {

using Clock = std::chrono::steady_clock;

ProfileReport profile_machine(const Settings& s, const Comm& comm, bool quick) {
  const auto t0 = Clock::now();
  const ModelDims& dims = s.model;
  const int bs = s.attention.block_size, w = s.attention.local_blocks;
  const int k0 = s.balance.dst.k0;
  const int64_t cap = s.train.micro_batch_tokens;
  // The step the run takes: LoRA's ([lora]: the frozen base, the adapters' GEMMs, the reduction of
  // the trainable tensors only; and only LoRA's memory, as a full model's state may not fit).
  Model<float> model(dims, s.lora);
  model.init(1);
  // Where train.device says: the same engine the trainer runs, so GPU runs time GPU kernels.
  AdamW opt(s.optim, model.weights().size());
  std::unique_ptr<Engine> engine = make_engine(s.engine(), comm, model, opt);
  engine->from_host();
  ProfileReport rep{LatencyModel(ModelShape{dims.n_layers, bs, w}), {}, {}, {}, {}, 0, 0};

  // Lengths: geometric up to the micro-batch capacity; budgets around k0 and dense.
  std::vector<int64_t> lens;
  for (int64_t L = std::max<int64_t>(2 * bs, cap / (quick ? 8 : 32)); L <= cap; L *= 2) lens.push_back(L);
  if (lens.empty() || lens.back() != cap) lens.push_back(cap);
  std::vector<int> ks = quick ? std::vector<int>{std::max(1, k0 / 2), 2 * k0 + 1}
                              : std::vector<int>{std::max(1, k0 / 2), k0, 2 * k0, 4 * k0 + 1};
  const int reps = quick ? 1 : 3;
  // Two families of micro-batches, so that tokens and kept blocks are told apart by the fit:
  //  - one document of each length (tokens vary; kept blocks grow with them),
  //  - full micro-batches packed with documents of one length (tokens fixed at the capacity; kept
  //    blocks from a few per document to k per row), as training packs short documents.
  struct Shape { int64_t len; int64_t docs; int k; };
  std::vector<Shape> grid;
  for (int64_t L : lens)
    for (int k : ks) grid.push_back({L, 1, k});
  for (int64_t L = bs; L < cap; L *= quick ? 4 : 2)
    for (int k : {ks.front(), ks.back()}) grid.push_back({L, cap / L, k});
  std::vector<LatencySample> attn, gate, lin, red;
  std::mt19937_64 rng(7);
  for (const Shape& g : grid) {
    PackedBatch b;
    for (int64_t d = 0; d < g.docs; ++d) {
      std::vector<uint32_t> seq(static_cast<size_t>(g.len));
      for (auto& t : seq) t = uint32_t(rng() % uint64_t(dims.vocab));
      b.add(seq);
    }
    const double tokens = double(b.n());
    AttnSettings at = s.attention;
    at.sparse = true, at.theta = 1e30;  // every candidate eligible: k decides
    at.dense.clear();  // every layer gates: the samples are a sparse layer's (the model costs dense ones)
    const AttnSettings a = at.for_budgets(std::vector<int>(size_t(dims.n_layers), g.k));
    std::vector<MicroBatchStats> runs;
    for (int r = 0; r < reps + 1; ++r) {  // the first run warms caches and is dropped
      engine->zero_grads();
      auto st = engine->forward_backward(b, a, float(1.0 / tokens));
      if (r > 0) runs.push_back(st);
    }
    std::sort(runs.begin(), runs.end(), [](auto& x, auto& y) { return x.total_ms < y.total_ms; });
    const MicroBatchStats& st = runs[runs.size() / 2];  // median run
    double kept = 0;
    for (const auto& gs : st.gating) kept += gs.kept_blocks / dims.n_kv_heads;
    kept /= dims.n_layers;
    double nl = dims.n_layers;
    attn.push_back({tokens, kept * bs * bs, st.attn_ms / nl});
    gate.push_back({tokens, double(g.docs) * LatencyModel::causal_blocks(g.len, bs), st.gating_ms / nl});
    lin.push_back({tokens, 0, std::max(1e-6, st.total_ms - st.attn_ms - st.gating_ms)});
  }
  // All-reduce: bucketed sums of gradient-sized buffers.
  for (size_t n = 1 << 14; n <= std::max<size_t>(model.weights().size(), 1 << 16) * 2; n *= 4) {
    engine->allreduce_ms(n, 1);  // warm-up (NCCL sets up its channels on the first call)
    red.push_back({double(n * sizeof(float)), 0, engine->allreduce_ms(n, 3)});
  }
  // Every rank must hold the same model: fit on rank 0's samples, broadcast the file contents.
  rep.attention = rep.model.fit(Part::Attention, attn);
  rep.gating = rep.model.fit(Part::Gating, gate);
  rep.linear = rep.model.fit(Part::Linear, lin);
  rep.allreduce = rep.model.fit(Part::AllReduce, red);
  std::vector<double> flat;
  for (Part p : {Part::Attention, Part::Gating, Part::Linear, Part::AllReduce})
    for (double c : rep.model.coeffs(p)) flat.push_back(c);
  comm.broadcast(std::span<unsigned char>(reinterpret_cast<unsigned char*>(flat.data()), flat.size() * sizeof(double)));
  size_t i = 0;
  for (Part p : {Part::Attention, Part::Gating, Part::Linear, Part::AllReduce}) {
    std::array<double, 3> c{flat[i], flat[i + 1], flat[i + 2]};
    rep.model.set_coeffs(p, c);
    i += 3;
  }
  rep.model.set_device(engine->device_name());
  rep.samples = int(attn.size() + gate.size() + lin.size() + red.size());
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rep;
}

}  // namespace sb
