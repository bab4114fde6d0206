// log.batches: every step's global batch written out as the model sees it, so that a reference
// implementation (bench/torch/torch_trajectory.py) can train on exactly the same documents in the same
// steps. One JSON line per step, appended by rank 0:
//   {"step": s, "targets": n, "segments": [{"doc": id, "begin": b, "tokens": [...], "targets": [...]}]}
// where "targets" are the trained next tokens (-1 where a loss mask or the segment's end leaves none);
// the step's loss is the sum of the segments' cross-entropies over n.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/shard.hpp"
#include "src/balance/segment.hpp"

namespace sb {

// Appends step `step`'s line to `path` (created by the first step of a fresh run, truncated then).
void append_batch_log(const std::string& path, int64_t step, bool fresh, const Dataset& ds,
                      const std::vector<Segment>& segs, int64_t targets);

}  // namespace sb
