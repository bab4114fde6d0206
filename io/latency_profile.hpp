// HDF5 storage of the latency model (DESIGN.md, "Latency predictor"): a group holding the
// device name, the model shape it was measured for, per-part coefficients, the online correction
// factors and the fit's held-out error. Plain data only, so io/ does not depend on src/balance.
//
// Layout of the group (h5dump-readable):
//   attributes  format = "sparsebalance-latency", version, device, n_layers, block_size,
//               local_blocks, density
//   datasets    coeffs [4][3] (part x {c0, c1, c2}), correction [4], heldout_error [4],
//               samples [4] (int64, samples per fit; 0 = analytic default)
//   parts       0 attention (per layer), 1 gating (per layer), 2 linear (whole model), 3 allreduce
#pragma once
#include <hdf5.h>

#include <array>
#include <cstdint>
#include <string>

namespace sb {

inline constexpr int kLatencyParts = 4;

struct LatencyProfile {
  std::string device = "analytic";
  int64_t n_layers = 1, block_size = 128, local_blocks = 1;
  std::array<std::array<double, 3>, kLatencyParts> coeffs{};  // [part][c0, c1, c2], ms
  std::array<double, kLatencyParts> correction{1, 1, 1, 1};   // EMA of measured / predicted
  std::array<double, kLatencyParts> heldout_error{0, 0, 0, 0};  // mean relative error, held-out
  std::array<int64_t, kLatencyParts> samples{0, 0, 0, 0};
  double density = 1.0;  // learned fraction of budgeted candidates that survive theta, (0, 1]
};

// Write into an open group (created by the caller, e.g. "/latency" of a checkpoint).
void save_latency_profile(hid_t group, const LatencyProfile& p);
// Read from a group; `file` names the source in errors (missing attributes, wrong format).
LatencyProfile load_latency_profile(hid_t group, const std::string& file);

// Whole-file convenience: the profile lives in the group "/latency".
void save_latency_profile_file(const std::string& path, const LatencyProfile& p);
LatencyProfile load_latency_profile_file(const std::string& path);

}  // namespace sb
