#include "src/model/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.hpp"
#include "kernels/kernels.hpp"

namespace sb {

static void need(bool ok, const std::string& field, const std::string& what) {
  if (!ok) throw Error("model.rope_scaling." + field + " " + what);
}

void check_rope_scaling(const RopeScaling& r) {
  if (r.type == "none") return;
  need(r.type == "linear" || r.type == "llama3" || r.type == "yarn", "type",
       "= \"" + r.type + "\": expected none, linear, llama3 or yarn");
  need(std::isfinite(r.factor) && r.factor >= 1, "factor", "must be a number >= 1 (got " + std::to_string(r.factor) + ")");
  if (r.type == "linear") return;
  need(r.original_max_positions > 0, "original_max_position_embeddings",
       "must be set (> 0) for rope_scaling.type = " + r.type);
  if (r.type == "llama3") {
    need(r.low_freq_factor > 0, "low_freq_factor", "must be > 0");
    need(r.high_freq_factor > r.low_freq_factor, "high_freq_factor", "must be > low_freq_factor");
  } else {
    need(r.beta_fast > 0 && r.beta_slow > 0, "beta_fast", "and beta_slow must be > 0");
    need(r.attention_factor >= 0, "attention_factor", "must be >= 0 (0: the default 0.1 ln(factor) + 1)");
  }
}

RopeTable rope_table(int D, double theta, const RopeScaling& r) {
  check_rope_scaling(r);
  RopeTable t;
  t.inv_freq = kernels::rope_plain_inv_freq(D, theta);  // theta^(-2d/D)
  const int half = D / 2;
  const double two_pi = 2 * std::numbers::pi;
  if (r.type == "linear") {  // positions divided by factor
    for (double& f : t.inv_freq) f /= r.factor;
  } else if (r.type == "llama3") {
    // Wavelengths longer than original/low_freq_factor are divided by factor, shorter than
    // original/high_freq_factor kept, and those between blended by a smooth factor.
    const double L = r.original_max_positions;
    const double low_wavelen = L / r.low_freq_factor, high_wavelen = L / r.high_freq_factor;
    for (double& f : t.inv_freq) {
      const double wavelen = two_pi / f;
      if (wavelen > low_wavelen) {
        f /= r.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (L / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1 - smooth) * f / r.factor + smooth * f;
      }
    }
  } else if (r.type == "yarn") {
    // The dimensions that turn fewer than beta_slow times over the original context are
    // interpolated (divided by factor), those that turn more than beta_fast times kept
    // (extrapolated), and a linear ramp over the dimensions between.
    auto dim_of = [&](double rotations) {  // the dimension whose wavelength fits `rotations` times
      return D * std::log(r.original_max_positions / (rotations * two_pi)) / (2 * std::log(theta));
    };
    double low = dim_of(r.beta_fast), high = dim_of(r.beta_slow);
    if (r.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, double(D - 1));
    if (low == high) high += 0.001;  // no zero-width ramp
    for (int d = 0; d < half; ++d) {
      const double ramp = std::clamp((d - low) / (high - low), 0.0, 1.0);  // 0: extrapolate, 1: interpolate
      const double extra = t.inv_freq[size_t(d)], inter = extra / r.factor;
      t.inv_freq[size_t(d)] = inter * ramp + extra * (1 - ramp);
    }
    t.scale = r.attention_factor > 0 ? r.attention_factor : (r.factor > 1 ? 0.1 * std::log(r.factor) + 1 : 1.0);
  }
  return t;
}

}  // namespace sb
