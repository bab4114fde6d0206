// What a rank tells the others in DST's exchange, and its wire format: a fixed-size vector of
// doubles, the same size on every rank (one all-gather, no rank needs another's plan).
#pragma once
#include <span>
#include <vector>

#include "src/balance/dst.hpp"

namespace sb {

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
size_t packed_size(const DstParams& p);  // the same for every rank: one all-gather
RankSummary unpack(std::span<const double> data);
// The same into `out`, reusing its vectors' memory: a rank unpacks every rank's summary each step
// (4096 ranks: ~16K small allocations, ~1.4 ms, when made afresh).
void unpack(std::span<const double> data, RankSummary& out);

}  // namespace sb
