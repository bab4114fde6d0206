// The balancer on a modelled cluster (DESIGN.md, `simulate`): every step draws a global batch of
// documents from a length preset, plans it with each batching policy and tunes it with each
// tuning policy for all modelled ranks in-process (the pure tune(), no MPI), and scores the
// result with the latency model as ground truth.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/balance/dst_exchange.hpp"
#include "src/balance/latency_model.hpp"
#include "src/balance/length_presets.hpp"
#include "src/balance/plan.hpp"
#include "src/balance/part_split.hpp"

namespace sb {

// The most micro-batches (ranks x micro_batches) one simulated step may plan: memory and time grow
// with them (src/balance/README.md, "simulate"); above it simulate() refuses, naming the keys.
inline constexpr int64_t kMaxSimMicroBatches = 65536;

struct SimConfig {
  int ranks = 8, micro_batches = 16, steps = 10;
  Preset preset = Preset::LongAlign;
  uint64_t seed = 1;
  double fill = 0.9;             // global batch = ranks x micro_batches x capacity x fill tokens
  int64_t capacity = 65536;      // tokens per micro-batch
  int64_t max_len = 65536;       // longest document of the preset
  bool reject_long = false;      // documents over capacity: windows (false) or error
  bool split_long = false;       // documents over capacity: split over ceil(len / capacity) ranks or more (place_long_docs)
  bool split_docs = false;       // balance.split_docs: costly documents that fit are split too
  double part_share = 1.0;       // balance.part_share: such a document's part costs at most this x the fair share
  double kv_bytes_per_token = 2048;  // K (or V) bytes of one token, all kv heads: the part exchange's volume
  double noise = 0;              // true time = model x (1 + noise*(2u-1)) per micro-batch
  DstParams dst;                 // target, bounds, k0, n_layers (tuning is set per policy)
  PlanOptions plan;
};

struct PolicyResult {
  std::string name;   // "<batching>+<tuning>"
  double makespan = 0, imbalance = 0, bubble = 0, recall = 0, speedup = 0;
  double plan_ms = 0;         // per rank per step: make_plan + T* + own items/summary/tune (what one rank pays)
  double make_plan_ms = 0;    // of which make_plan
  double gap_lb = 0;          // makespan / lower bound
  double planned_imbalance = 0;
  int part_k_lo = 0, part_k_hi = 0;  // lowest and highest budget of any split part (0: none split)
  // Where the time goes (per rank, mean over steps): the mean rank time; of it the split parts'
  // exchange; and their cost beyond their documents' whole cost at k0 (with PartGating::Whole each
  // member gates the whole document; the cut's rounding to blocks): makespan = mean x imbalance.
  double mean_ms = 0, exchange_ms = 0, split_extra_ms = 0;
};

struct SimResult {
  std::vector<PolicyResult> policies;
  double lower_bound = 0;     // mean over steps: max(sum seg cost at k_lo / ranks, largest seg cost at k_lo);
                              // splitting: a split document counts as its members' parts (with the exchange)
  double token_bound = 0;     // mean over steps: sum of whole-document costs at k_lo / ranks (total work / ranks)
  double whole_doc_bound = 0; // max(token_bound, costliest whole document at k_lo): no plan of whole documents beats it
  double token_bound_k0 = 0;  // the token-level bound at k0: what fixed budgets (and DST's mean target) can reach
  double token_bound_k0_exchange = 0;  // plus the unavoidable exchange (split_long: each document over capacity
                                       // on ceil(len / capacity) members, each paying part_exchange_ms), / ranks
  double token_bound_k0_floor = 0;     // plus, for those members, the gating each runs beyond its share
                                       // (part_gating_ms: with Whole the G - 1 copies beyond one; with OwnRows
                                       // the per-layer constants): what split plans of this implementation cannot beat
  double split_per_step = 0;  // documents split per step (split_long)
  double lower_bound_k0 = 0;  // the same at k0 (floor for fixed budgets)
  int k_lo = 0;               // lowest allowed budget max(k_min, floor(k0 (1 - max_change)))
  double attention_share = 0; // attention / total of one micro-batch of one max_len document at k0
  double docs_per_step = 0, segments_per_step = 0, tokens_per_step = 0;
};

// The members' parts of split groups, cut as the trainer cuts them (split_document over
// block_costs at k0, sparse, with the latency model's token_cost; piece_batch): rank r's parts in
// group order, each with its document's length (build_items' doc_len: DST costs a part as its rows
// of the whole document, as in train) and its exchange (part_exchange_ms, in DST's prediction too).
struct SplitParts {
  std::vector<std::vector<MicroBatch>> mbs;      // [rank][part]
  std::vector<std::vector<int64_t>> doc_len;     // [rank][part]
  std::vector<std::vector<double>> exchange_ms;  // [rank][part]
};
// `member_ms` (optional) gets the CPU time of the cuts summed over the members: a real rank cuts only
// its own groups' documents, so that / ranks is what one rank pays on average.
SplitParts split_parts(std::span<const PartGroup> groups, int ranks, const LatencyModel& lm, int k0, double kv_bytes_per_token,
                       double* member_ms = nullptr);

SimResult simulate(const SimConfig& cfg, const LatencyModel& lm, const RecallModel& rm);

}  // namespace sb
