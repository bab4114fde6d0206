// Workload-aware dynamic sparsity tuning (DESIGN.md, "DST"): after one collective exchange of
// predicted times, every rank computes the same target time T* and tunes only its own attention
// budgets, per (micro-batch, layer): lower them where recall lost per ms saved is smallest until
// it meets T*, or raise them where recall gained per ms spent is largest, never past T*.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "src/balance/latency_model.hpp"
#include "src/balance/plan.hpp"
#include "src/comm/comm.hpp"

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
};
DstItems build_items(std::span<const MicroBatch> mbs, const LatencyModel& lm, const RecallModel& rm, const DstParams& p);

// What a rank sends in the exchange: predicted times at k0, recall at k0 and (target = recall
// only) a sampled curve of its greedy path: (time, recall sum) after lowering / raising.
struct RankSummary {
  int n_mb = 0;               // micro-batches (0: an idle rank, which does not set T*)
  double ms_k0 = 0, recall_k0 = 0, weight = 0, ms_lo = 0, ms_hi = 0;
  std::vector<double> lo_ms, lo_rec;  // lowering path, time descending from (ms_k0, recall_k0)
  std::vector<double> hi_ms, hi_rec;  // raising path, time ascending from (ms_k0, recall_k0)
  // Both paths monotone in time and recall (checked by summarize() and unpack(), not exchanged):
  // target_time() may then infer steps of its bisection instead of evaluating them. Leave it false
  // on summaries made by hand; false is always correct, only slower.
  bool monotone = false;
};
RankSummary summarize(const DstItems& items, const DstParams& p);
std::vector<double> pack(const RankSummary& s, const DstParams& p);
size_t packed_size(const DstParams& p);  // the same for every rank: one MPI_Allgather
RankSummary unpack(std::span<const double> data);
// The same into `out`, reusing its vectors' memory: a rank unpacks every rank's summary each step
// (4096 ranks: ~16K small allocations, ~1.4 ms, when made afresh).
void unpack(std::span<const double> data, RankSummary& out);

struct DstInput {
  std::vector<RankSummary> ranks;  // every rank, as gathered
  DstItems mine;                   // this rank's items
};

struct TuneResult {
  std::vector<std::vector<int>> k;        // [micro-batch][layer] budgets for THIS rank
  double target_ms = 0;                   // T*, identical on every rank
  std::vector<double> rank_predicted_ms;  // all ranks after tuning, from the summaries (identical on
                                          // every rank; exact up to one budget step)
  double planned_imbalance_before = 1, planned_imbalance_after = 1;  // max/mean of predicted rank times
  double my_predicted_ms = 0;             // this rank after tuning, exact
  double my_recall = 1;                   // this rank's mean recall after tuning (token-weighted)
  double my_weight = 0;                   // its recall weight (tokens x layers)
};

// T* from the gathered summaries (mean / min / max of times at k0, or the smallest T whose
// estimated mean recall is at least the recall at k0: bisection over T, exact to the bit whichever
// of its steps are evaluated or inferred).
double target_time(std::span<const RankSummary> ranks, const DstParams& p);
// Greedy tuning of one rank's items toward T* (bidirectional); fills k, my_* fields.
TuneResult tune_rank(const DstItems& items, double target_ms, const DstParams& p);
// The pure function: T* from input.ranks, then tune input.mine (the items of `my_rank`).
TuneResult tune(const DstInput& input, int my_rank, const DstParams& p);
// One MPI_Allgather of every rank's summary (fixed size), then tune() of `mine`, this rank's
// micro-batches (from the whole plan, or from its group's plan).
TuneResult exchange_and_tune(const Comm& comm, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p);
// The same with a workspace kept across steps (the gathered buffer and the unpacked summaries), so
// that steady-state steps allocate nothing for the exchange.
struct DstExchange {
  std::vector<double> gathered;
  DstInput in;
};
TuneResult exchange_and_tune(const Comm& comm, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p, DstExchange& work);

}  // namespace sb
