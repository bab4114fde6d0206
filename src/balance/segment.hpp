// The units the balancer moves around: a window of a document, and a micro-batch of windows.
// Shared by plan.hpp (SAB) and latency_model.hpp (costs), so neither includes the other.
#pragma once
#include <cstdint>
#include <vector>

namespace sb {

// A window of one document: tokens [begin, begin + len) of document `doc`. Trained as its own
// sequence (attention does not cross windows).
struct Segment {
  uint64_t doc = 0;
  uint64_t begin = 0;
  uint64_t len = 0;
};

// Segments packed back to back into one forward/backward pass; tokens = sum of their lengths.
struct MicroBatch {
  std::vector<Segment> segs;
  int64_t tokens = 0;
};

}  // namespace sb
