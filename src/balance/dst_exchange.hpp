// DST's step on one rank: its summary out, every rank's in (one collective), T*, then its own
// budgets. Balance makes no MPI call: the collective is a function passed in (RankExchange), so
// the planning stays on costs and the whole step runs in a test without MPI.
#pragma once
#include <functional>
#include <span>
#include <vector>

#include "src/balance/dst_summary.hpp"
#include "src/balance/dst_target.hpp"
#include "src/balance/dst_tune.hpp"

namespace sb {

struct DstInput {
  std::vector<RankSummary> ranks;  // every rank, as gathered
  DstItems mine;                   // this rank's items
};

// The pure function: T* from input.ranks, then tune input.mine (the items of `my_rank`).
TuneResult tune(const DstInput& input, int my_rank, const DstParams& p);
// The collective of the exchange, as balance sees it: this rank's index, the number of ranks,
// and an all-gather of equal-length blocks (`all`, of mine.size() * ranks values, receives every
// rank's `mine` in rank order). The training loop passes Comm::allgather; a test may pass its own.
struct RankExchange {
  int rank = 0, ranks = 1;
  std::function<void(std::span<const double> mine, std::span<double> all)> allgather;
};
// The exchange: this rank's packed summary `mine` out, every rank's in (one all-gather: every
// summary has the same size, so ranks need not know each other's plans), unpacked into `ranks`.
// `gathered` is the receive buffer; both keep their memory across steps.
void exchange_summaries(const RankExchange& ex, std::span<const double> mine, std::vector<double>& gathered,
                        std::vector<RankSummary>& ranks);
// Predict (build_items, summarize), exchange, tune() of `mine`, this rank's
// micro-batches (from the whole plan, or from its group's plan).
TuneResult exchange_and_tune(const RankExchange& ex, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p);
// The same with a workspace kept across steps (the gathered buffer and the unpacked summaries), so
// that steady-state steps allocate nothing for the exchange.
struct DstExchange {
  std::vector<double> gathered;
  DstInput in;
};
TuneResult exchange_and_tune(const RankExchange& ex, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p, DstExchange& work);

}  // namespace sb
