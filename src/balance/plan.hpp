// Sparsity-aware batching (DESIGN.md, "SAB"): split a global batch of document windows over
// ranks x micro-batches by predicted cost, under a per-micro-batch token capacity.
// Deterministic: every rank computes the same plan from the same inputs.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/balance/latency_model.hpp"
#include "src/balance/segment.hpp"

namespace sb {

// Cut documents (id, length) into segments of at most `capacity` tokens, in order. With
// reject = true a longer document is an sb::Error naming it, its length, the capacity and the
// keys (train.micro_batch_tokens, data.long_docs). Empty documents are skipped.
std::vector<Segment> make_segments(std::span<const std::pair<uint64_t, uint64_t>> docs, int64_t capacity, bool reject);

enum class Batching { Sequential, Tokens, Quadratic, Sparse };
// "sequential" | "tokens" | "quadratic" | "sparse"; anything else is an sb::Error naming balance.batching.
Batching parse_batching(const std::string& s);
const char* batching_name(Batching b);

struct Plan {
  std::vector<std::vector<MicroBatch>> ranks;  // [rank][micro-batch]; a rank may have none
  uint64_t hash() const;                       // FNV-1a over the whole plan (cross-rank check)
  size_t segments() const;
};

struct PlanOptions {
  int swap_rounds = 64;  // sparse only: improving moves/swaps between the most and least loaded ranks
  // 0 (default): one-level plan over all ranks. g in (0, ranks): two-level plan for tokens,
  // quadratic and sparse: the data-order segments are cut into contiguous runs of equal predicted
  // cost per rank, one run per group of g consecutive ranks (the last group may be smaller), and
  // each run is planned over its group as below. A rank then needs only its own group's plan
  // (make_group_plan): O(n) for the cut plus LPT over about n*g/ranks segments.
  int group_ranks = 0;
};

// sequential: data order, `ranks` contiguous chunks of nearly equal segment count, each packed in
//             order into micro-batches of at most `capacity` tokens (as many as needed).
// tokens:     longest-processing-time first (LPT) over ranks x micro_batches bins, cost = tokens.
// quadratic:  LPT with the dense cost a*L + b*L^2 (LatencyModel::dense_segment_cost).
// sparse:     LPT with the predicted sparse cost at budget k0 (LatencyModel::segment_cost), then
//             improving moves/swaps between the most and the least loaded rank.
// LPT gives each segment, costliest first (ties: lower index), to the least-loaded rank (ties:
// lower rank) with room, into its fullest micro-batch that fits; when no rank has room it opens
// an extra micro-batch on the least-loaded rank. Segments longer than `capacity` are an error.
// `preload` (empty, or one per rank): cost already on each rank before the plan (its parts of
// documents in parts, in the batching's cost units: split_cost), which LPT and the swaps balance
// around. The one-level plan only (a two-level plan ignores it).
Plan make_plan(std::span<const Segment> segs, int ranks, int micro_batches_per_rank, int64_t capacity, Batching batching,
               const LatencyModel& lm, int k0, const PlanOptions& opt = {}, std::span<const double> preload = {});

// ---- documents in parts (data.long_docs = "split", src/parts/groups.hpp)

// A document trained whole by `ranks` consecutive ranks from `first`, each with a part of it.
struct PartGroup {
  uint64_t doc = 0, len = 0;
  int first = 0, ranks = 0;
};
// One member's cost of a document of `len` tokens split over G ranks, in `batching`'s units
// (tokens: len / G; quadratic and sparse: the document's predicted ms / G, the split being balanced
// by work, plus part_gating_ms and the exchange; with PartGating::Whole (lm.part_gating()) the
// gating is not split: every member runs the whole document's).
double split_cost(Batching batching, const LatencyModel& lm, int64_t len, int G, int k0, double kv_bytes_per_token);
// The K/V exchange of one member of G per step: per layer an all-gather of K and of V in the
// forward, again in the backward, and a reduce-scatter of dK and of dV, each member receiving the
// (G - 1) / G of len x kv_bytes_per_token bytes that it does not hold (the bytes bench_cp_exchange
// measures; the latency model's all-reduce of those bytes counts as two such collectives). 0 for G < 2.
double part_exchange_ms(const LatencyModel& lm, int64_t len, int G, double kv_bytes_per_token);
// The gating (all layers) that every member of a group runs beyond its share: the whole document's
// with PartGating::Whole; with OwnRows (each member gates its own rows) the per-layer constant only.
double part_gating_ms(const LatencyModel& lm, int64_t len);
// Moves the documents to split out of `docs` (data order kept for the rest) into groups of
// consecutive ranks, costliest first, each onto the window of ranks with the least load so far
// (ties: the lowest first rank). A document longer than `capacity` is split over at least
// ceil(len / capacity) ranks (memory), and over more, up to `ranks`, when one member's part would
// still cost more than the fair share (all documents' cost / ranks, in `batching`'s units): the
// whole-document bound is what splitting removes. With `split_fitting` (balance.split_docs) a
// document that fits one micro-batch but costs more than `fitting_part` x the fair share
// (balance.part_share, in (0, 1]) is split too, over enough ranks that each part is within that:
// small parts fill the gaps that whole documents and long documents' parts leave (one micro-batch
// per rank needs 0.1, bench/results/2026-12-01-parts-beside-big-docs.md), at the price of more members' exchange; then a group whose
// least busy window would end above the mean load (exchange included) takes up to 4 more members
// while that lowers the window's top. Whole documents that stay in `docs` and cost more than 0.4 x
// that mean load hold their ranks (LPT, from rank 0) while the groups are placed, and any group
// then grows as above: the groups leave such a document a rank where it fits (one micro-batch per
// rank); they are lifted before returning, make_plan places them. `load`
// (one per rank, zeros to start) gets every member's split_cost. Groups come back in placement
// order, the order in which every member runs them (the lowest pending group's members are all at
// it: no deadlock). An sb::Error naming data.long_docs and train.micro_batch_tokens when a document
// needs more than `ranks`.
std::vector<PartGroup> place_long_docs(std::vector<std::pair<uint64_t, uint64_t>>& docs, int64_t capacity, int ranks,
                                        Batching batching, const LatencyModel& lm, int k0, double kv_bytes_per_token,
                                        bool split_fitting, std::vector<double>& load, double fitting_part = 1.0);

// The ranks of make_plan's plan that share `rank`'s group (opt.group_ranks), exactly as make_plan
// makes them: ranks[i] is rank first_rank + i. With one group (group_ranks = 0, >= ranks, or
// sequential batching) it is the whole plan. What one rank computes when it needs only its group.
struct GroupPlan {
  int first_rank = 0;
  std::vector<std::vector<MicroBatch>> ranks;
};
GroupPlan make_group_plan(std::span<const Segment> segs, int ranks, int micro_batches_per_rank, int64_t capacity, Batching batching,
                          const LatencyModel& lm, int k0, const PlanOptions& opt, int rank);

}  // namespace sb
