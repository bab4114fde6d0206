#include "src/config/schema.hpp"

namespace sb {

std::vector<KeySpec> schema_balance() {
  using T = KeyType;
  return {
      // [balance] SAB + DST + latency predictor (DESIGN.md; src/balance/README.md)
      {"balance.batching", T::String, "sequential", 0, 0, {"sequential", "tokens", "quadratic", "sparse"}, "how the global batch is split over ranks x micro-batches"},
      {"balance.tuning", T::String, "fixed", 0, 0, {"fixed", "dst"}, "attention budgets: fixed k0, or dynamic sparsity tuning"},
      {"balance.target", T::String, "mean", 0, 0, {"mean", "min", "max", "recall"}, "DST target time T*: mean/min/max of predicted rank times, or the smallest T* keeping mean recall >= recall at k0"},
      {"balance.max_change", T::Float, "0.2", 0, 1, {}, "DST cap p: budgets stay within [floor(k0(1-p)), ceil(k0(1+p))]"},
      {"balance.k_min", T::Int, "0", 0, 1 << 20, {}, "absolute lower bound of a tuned budget"},
      {"balance.k_max", T::Int, "1048576", 0, 1 << 20, {}, "absolute upper bound of a tuned budget"},
      {"balance.ema", T::Float, "0.3", 0, 1, {}, "weight of a new measurement in the latency/recall online corrections"},
      {"balance.profile", T::String, "", 0, 0, {}, "latency profile (HDF5, from `sparsebalance profile`); empty = analytic model"},
      {"balance.self_profile", T::Bool, "true", 0, 0, {}, "with no balance.profile, time the model briefly at start (a quick `profile`) instead of starting from analytic constants"},
      {"balance.swap_rounds", T::Int, "64", 0, 1 << 20, {}, "SAB: improving moves/swaps between the most and least loaded ranks"},
      {"balance.recall_alpha", T::Float, "0.5", 0.01, 5, {}, "initial recall exponent: recall = kept_fraction^alpha per layer, learned online"},
      {"balance.group_ranks", T::Int, "0", 0, 1 << 20, {}, "two-level SAB plan (tokens/quadratic/sparse): the batch is cut into cost-balanced runs, one per group of this many consecutive ranks, and each rank plans only its group's run (0 = one plan over all ranks; for thousands of ranks). In simulate, plan_ms then counts one rank's group plan"},
      {"balance.split_docs", T::Bool, "false", 0, 0, {}, "with data.long_docs = \"split\": also split a document that fits one micro-batch when its predicted cost is above the fair share (all documents' cost / ranks), over enough ranks that each part is within it; long documents get such groups anyway (src/balance/README.md, 'Documents in parts')", "balance.shard_docs"},
      {"balance.part_share", T::Float, "1", 0.01, 1, {}, "with balance.split_docs: a document that fits is split when it costs more than this fraction of the fair share, over enough ranks that each part is within it; small parts (0.1) fill the gaps whole documents leave, at more exchange (src/balance/README.md, 'Documents in parts')", "balance.shard_part"},
      {"balance.curve_points", T::Int, "32", 2, 4096, {}, "samples of each rank's recall/time curve exchanged for balance.target = recall"},
      {"balance.recall_rows", T::Int, "0", 0, 1 << 20, {}, "true recall (the dense softmax mass on the kept blocks, kernels::true_recall) measured on this many sampled query-block rows per layer and micro-batch; the recall model (balance.target = recall) learns from it instead of the gate's own estimate, and the metrics log records both (0 = off: the gate's estimate)"},
      {"balance.recall_every", T::Int, "1", 1, 1 << 20, {}, "with balance.recall_rows: measure true recall every this many steps (steps without it leave the recall model as it is)"},
      // [simulate] the balancer on a modelled cluster (no model run)
      {"simulate.ranks", T::Int, "8", 1, 1 << 16, {}, "modelled ranks (with simulate.micro_batches at most 65536 micro-batches per step: src/balance/README.md, \"Simulate\")"},
      {"simulate.micro_batches", T::Int, "16", 1, 1 << 16, {}, "micro-batches per rank (token capacity simulate.capacity each)"},
      {"simulate.preset", T::String, "longalign", 0, 0, {"longalign", "chatqa2", "uniform", "fixed"}, "document-length distribution"},
      {"simulate.steps", T::Int, "10", 1, 1 << 20, {}, "steps (global batches) simulated"},
      {"simulate.seed", T::Int, "1", 0, kNoUpperBound, {}, "seed of the length sampler and of the noise"},
      {"simulate.fill", T::Float, "0.9", 0.01, 1, {}, "global batch = ranks x micro_batches x capacity x fill tokens"},
      {"simulate.capacity", T::Int, "65536", 16, 1 << 30, {}, "token capacity of one micro-batch"},
      {"simulate.max_len", T::Int, "0", 0, 1 << 30, {}, "longest document (0 = simulate.capacity); longer than capacity -> windows"},
      {"simulate.long_docs", T::String, "window", 0, 0, {"window", "split"}, "documents longer than simulate.capacity: cut into windows, or split over ceil(length / capacity) ranks (as data.long_docs = \"split\")", "", {{"shard", "split"}}},
      {"simulate.kv_bytes_per_token", T::Float, "2048", 0, 1e12, {}, "bytes of K (or V) of one token over all kv heads: the volume of a split document's exchange (8 kv heads x 128 x bf16 = 2048)"},
      {"simulate.noise", T::Float, "0", 0, 0.99, {}, "true micro-batch time = model x (1 + noise*(2u-1))"},
      {"simulate.n_layers", T::Int, "32", 1, 1024, {}, "modelled layers (analytic model; a profile brings its own shape)"},
      {"simulate.block_size", T::Int, "128", 4, 4096, {}, "modelled block size Bs"},
      {"simulate.local_blocks", T::Int, "1", 0, 1 << 20, {}, "modelled local blocks w"},
      {"simulate.k", T::Int, "32", 0, 1 << 20, {}, "modelled default budget k0"},
      {"simulate.linear_us_per_token", T::Float, "80", 0, 1e9, {}, "analytic model: token-linear work of the whole model, fwd+bwd, us per token"},
      {"simulate.attn_ps_per_pair", T::Float, "560", 0, 1e12, {}, "analytic model: attention fwd+bwd per layer, ps per kept (query, key) token pair"},
      {"simulate.gating_ns_per_pair", T::Float, "10", 0, 1e12, {}, "analytic model: gating per layer, ns per causal block pair"},
      {"simulate.mb_overhead_ms", T::Float, "2", 0, 1e9, {}, "analytic model: fixed cost of one micro-batch, ms"},
      {"simulate.alpha_lo", T::Float, "0.3", 0.01, 5, {}, "recall exponent of the first layer (layers spread linearly to alpha_hi)"},
      {"simulate.alpha_hi", T::Float, "0.7", 0.01, 5, {}, "recall exponent of the last layer"},
  };
}

}  // namespace sb
