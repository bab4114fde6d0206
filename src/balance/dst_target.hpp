// DST's target time T*, computed by every rank alike from the gathered summaries.
#pragma once
#include <span>

#include "src/balance/dst_summary.hpp"

namespace sb {

// T* from the gathered summaries (mean / min / max of times at k0, or the smallest T whose
// estimated mean recall is at least the recall at k0: bisection over T, exact to the bit whichever
// of its steps are evaluated or inferred).
double target_time(std::span<const RankSummary> ranks, const DstParams& p);

}  // namespace sb
