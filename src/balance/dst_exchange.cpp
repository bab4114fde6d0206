#include "src/balance/dst_exchange.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "src/balance/dst_summary.hpp"

namespace sb {

namespace {

double estimate_ms(const RankSummary& r, double T, const DstParams& p) {
  if (r.n_mb == 0 || p.tuning == Tuning::Fixed) return r.ms_k0;
  return r.ms_k0 > T ? std::max(T, r.ms_lo) : std::max(r.ms_k0, std::min(T, r.ms_hi));
}

}  // namespace

TuneResult tune(const DstInput& in, int my_rank, const DstParams& p) {
  if (my_rank < 0 || my_rank >= int(in.ranks.size()))
    throw Error("dst: rank " + std::to_string(my_rank) + " out of range (" + std::to_string(in.ranks.size()) + " ranks)");
  double T = target_time(in.ranks, p);
  TuneResult res = tune_rank(in.mine, T, p);
  double sum0 = 0, max0 = 0, sum1 = 0, max1 = 0;
  res.rank_predicted_ms.resize(in.ranks.size());
  for (size_t r = 0; r < in.ranks.size(); ++r) {
    double t = estimate_ms(in.ranks[r], T, p);
    res.rank_predicted_ms[r] = t;
    sum0 += in.ranks[r].ms_k0, max0 = std::max(max0, in.ranks[r].ms_k0), sum1 += t, max1 = std::max(max1, t);
  }
  double R = double(in.ranks.size());
  res.planned_imbalance_before = sum0 > 0 ? max0 / (sum0 / R) : 1.0;
  res.planned_imbalance_after = sum1 > 0 ? max1 / (sum1 / R) : 1.0;
  return res;
}

void exchange_summaries(const RankExchange& ex, std::span<const double> mine, std::vector<double>& gathered,
                        std::vector<RankSummary>& ranks) {
  const size_t n = mine.size();
  gathered.resize(n * size_t(ex.ranks));
  ex.allgather(mine, gathered);
  ranks.resize(size_t(ex.ranks));
  for (int r = 0; r < ex.ranks; ++r) unpack(std::span<const double>(gathered.data() + n * size_t(r), n), ranks[size_t(r)]);
}

TuneResult exchange_and_tune(const RankExchange& ex, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p, DstExchange& work) {
  work.in.mine = build_items(mine, lm, rm, p);
  exchange_summaries(ex, pack(summarize(work.in.mine, p), p), work.gathered, work.in.ranks);
  return tune(work.in, ex.rank, p);
}

TuneResult exchange_and_tune(const RankExchange& ex, std::span<const MicroBatch> mine, const LatencyModel& lm,
                             const RecallModel& rm, const DstParams& p) {
  DstExchange work;
  return exchange_and_tune(ex, mine, lm, rm, p, work);
}

}  // namespace sb
