// Workload-aware dynamic sparsity tuning (DESIGN.md, "DST"): after one collective exchange of
// predicted times, every rank computes the same target time T* and tunes only its own attention
// budgets, per (micro-batch, layer): lower them where recall lost per ms saved is smallest until
// it meets T*, or raise them where recall gained per ms spent is largest, never past T*.
// By job: this file (parameters, the tunable items), dst_tune (the greedy), dst_summary (what a
// rank sends, and its wire format), dst_target (T*), dst_exchange (one rank's step: exchange, T*,
// tune; include it for all of DST).
#pragma once
#include <span>
#include <string>
#include <vector>

#include "src/balance/latency_model.hpp"
#include "src/balance/plan.hpp"
#include "src/balance/recall_model.hpp"

namespace sb {

enum class Target { Mean, Min, Max, Recall };
enum class Tuning { Fixed, Dst };
Target parse_target(const std::string& s);  // mean|min|max|recall (balance.target)
Tuning parse_tuning(const std::string& s);  // fixed|dst (balance.tuning)
const char* target_name(Target t);
const char* tuning_name(Tuning t);

struct DstParams {
  int k0 = 4;                // default budget (attention.k)
  int k_min = 0, k_max = 1 << 20;
  double max_change = 0.2;   // p: k in [floor(k0(1-p)), ceil(k0(1+p))], then clipped to [k_min, k_max]
  Target target = Target::Mean;
  Tuning tuning = Tuning::Dst;
  int n_layers = 1;
  int curve_points = 32;     // samples of each rank's recall/time curve sent for target = recall
};

// The allowed budgets, ascending, and the index of k0 among them (k0 itself is always allowed).
std::vector<int> budget_steps(const DstParams& p, int* k0_index = nullptr);

// One rank's tunable items (micro-batch x layer) at every allowed budget.
struct DstItems {
  int n_mb = 0, n_layers = 0, n_steps = 0, i0 = 0;
  std::vector<int> ks;           // [step] budgets
  std::vector<double> fixed_ms;  // [mb] time that budgets do not change (linear, gating, constants)
  std::vector<double> attn_ms;   // [mb][step] attention time of ONE layer at ks[step]
  std::vector<double> rec;       // [mb][layer][step] recall x tokens (sum over the mb's segments)
  std::vector<double> weight;    // [mb] tokens x n_layers (recall weight)
  // [layer] 1: a dense layer (attention.dense_layers, LatencyModel::dense_layers): never tuned, its
  // attention over every causal block in fixed_ms, its recall 1 at every step; empty: none.
  std::vector<uint8_t> dense;
  bool tuned(int l) const { return !(size_t(l) < dense.size() && dense[size_t(l)]); }
  int n_tuned() const {  // layers DST tunes
    int n = n_layers;
    for (uint8_t d : dense) n -= d ? 1 : 0;
    return n;
  }
};
// `doc_len` (empty, or one per micro-batch) marks this rank's parts of documents in parts (context
// parallelism): doc_len[m] > 0 says mbs[m]'s segments are its pieces [begin, begin + len) of ONE
// document of doc_len[m] tokens. A piece's rows keep their blocks of the whole document (row i has
// i + 1 causal blocks), so its attention and recall are those rows' share, and its gating, which does
// not depend on the budget, is its rows' (lm.part_gating() OwnRows) or the whole document's (Whole,
// every member gating it all). 0: whole sequences.
// `fixed_extra_ms` (empty, or one per micro-batch): time a micro-batch also takes that no budget
// changes (a split part's K/V exchange, part_exchange_ms), added to its fixed_ms.
DstItems build_items(std::span<const MicroBatch> mbs, const LatencyModel& lm, const RecallModel& rm, const DstParams& p,
                     std::span<const int64_t> doc_len = {}, std::span<const double> fixed_extra_ms = {});
// The predicted time of items' micro-batch m with one budget per layer (each an allowed budget):
// what tune_rank adds up for it.
double item_ms(const DstItems& it, int m, std::span<const int> k_per_layer);

}  // namespace sb
