// Document-length samplers for `simulate` (deterministic by seed; own distributions on top of
// std::mt19937_64 so results do not depend on the standard library's distribution code).
//   longalign  long tail: 70% log-uniform [max/256, max/16], 25% log-uniform [max/16, max/2],
//              5% exactly max (most documents short, a few at the maximum)
//   chatqa2    bimodal: 60% log-uniform [max/64, max/16], 40% uniform [max/4, max]
//   uniform    uniform [1, max]
//   fixed      every document max/4
#pragma once
#include <cstdint>
#include <random>
#include <string>

namespace sb {

enum class Preset { LongAlign, ChatQA2, Uniform, Fixed };
Preset parse_preset(const std::string& s);  // simulate.preset
const char* preset_name(Preset p);

class LengthSampler {
 public:
  LengthSampler(Preset preset, int64_t max_len, uint64_t seed);
  uint64_t next();
  double uniform01();  // [0, 1), 53 bits

 private:
  uint64_t log_uniform(double lo, double hi);
  Preset preset_;
  int64_t max_;
  std::mt19937_64 rng_;
};

}  // namespace sb
