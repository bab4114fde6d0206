#include "src/balance/length_presets.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"
#include "base/named.hpp"

namespace sb {

constexpr Named<Preset> kPresets[] = {
    {Preset::LongAlign, "longalign"}, {Preset::ChatQA2, "chatqa2"}, {Preset::Uniform, "uniform"}, {Preset::Fixed, "fixed"}};

Preset parse_preset(const std::string& s) { return parse_named(kPresets, s, "simulate.preset"); }
const char* preset_name(Preset p) { return name_of(kPresets, p); }

LengthSampler::LengthSampler(Preset preset, int64_t max_len, uint64_t seed) : preset_(preset), max_(max_len), rng_(seed) {
  if (max_len < 1) throw Error("length sampler: max length " + std::to_string(max_len) + " must be >= 1 (simulate.max_len)");
}

double LengthSampler::uniform01() { return double(rng_() >> 11) * 0x1.0p-53; }

uint64_t LengthSampler::log_uniform(double lo, double hi) {
  lo = std::max(lo, 1.0), hi = std::max(hi, lo);
  double x = std::exp(std::log(lo) + uniform01() * (std::log(hi) - std::log(lo)));
  return uint64_t(std::clamp<int64_t>(std::llround(x), 1, max_));
}

uint64_t LengthSampler::next() {
  double M = double(max_), u = uniform01();
  switch (preset_) {
    case Preset::LongAlign:
      if (u < 0.70) return log_uniform(M / 256, M / 16);
      if (u < 0.95) return log_uniform(M / 16, M / 2);
      return uint64_t(max_);
    case Preset::ChatQA2:
      if (u < 0.60) return log_uniform(M / 64, M / 16);
      return uint64_t(std::clamp<int64_t>(std::llround(M / 4 + uniform01() * (M - M / 4)), 1, max_));
    case Preset::Uniform:
      return 1 + uint64_t(uniform01() * M) % uint64_t(max_);
    case Preset::Fixed:
      return uint64_t(std::max<int64_t>(1, max_ / 4));
  }
  return 1;
}

}  // namespace sb
