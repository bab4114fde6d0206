#include "io/latency_profile.hpp"

#include <cmath>
#include <vector>

#include "io/file_checksum.hpp"
#include "io/h5.hpp"
#include "base/error.hpp"

namespace sb {

static constexpr const char* kFormat = "sparsebalance-latency";
static constexpr int64_t kVersion = 1;

void save_latency_profile(hid_t group, const LatencyProfile& p) {
  h5::write_attr(group, "format", std::string(kFormat));
  h5::write_attr(group, "version", kVersion);
  h5::write_attr(group, "device", p.device);
  h5::write_attr(group, "n_layers", p.n_layers);
  h5::write_attr(group, "block_size", p.block_size);
  h5::write_attr(group, "local_blocks", p.local_blocks);
  h5::write_attr(group, "density", p.density);
  std::vector<double> c;
  for (const auto& part : p.coeffs) c.insert(c.end(), part.begin(), part.end());
  h5::write_vector(group, "coeffs", c, {hsize_t(kLatencyParts), 3});
  h5::write_vector(group, "correction", std::vector<double>(p.correction.begin(), p.correction.end()));
  h5::write_vector(group, "heldout_error", std::vector<double>(p.heldout_error.begin(), p.heldout_error.end()));
  h5::write_vector(group, "samples", std::vector<int64_t>(p.samples.begin(), p.samples.end()));
}

LatencyProfile load_latency_profile(hid_t group, const std::string& file) {
  h5::check_format(group, file, kFormat, kVersion, "a latency profile");
  LatencyProfile p;
  p.device = h5::read_attr_string(group, "device", file);
  p.n_layers = h5::read_attr_int(group, "n_layers", file);
  p.block_size = h5::read_attr_int(group, "block_size", file);
  p.local_blocks = h5::read_attr_int(group, "local_blocks", file);
  p.density = h5::read_attr_double(group, "density", file);
  auto c = h5::read_vector<double>(group, "coeffs", file, kLatencyParts * 3);
  for (int i = 0; i < kLatencyParts; ++i)
    for (int j = 0; j < 3; ++j) p.coeffs[i][j] = c[i * 3 + j];
  auto corr = h5::read_vector<double>(group, "correction", file, kLatencyParts);
  auto err = h5::read_vector<double>(group, "heldout_error", file, kLatencyParts);
  auto n = h5::read_vector<int64_t>(group, "samples", file, kLatencyParts);
  for (int i = 0; i < kLatencyParts; ++i) p.correction[i] = corr[i], p.heldout_error[i] = err[i], p.samples[i] = n[i];
  // Values a planner can use: a NaN here would silently degrade every later plan (issue 24).
  for (int i = 0; i < kLatencyParts; ++i) {
    for (int j = 0; j < 3; ++j)
      if (!std::isfinite(p.coeffs[i][j]))
        throw Error(file + ": dataset 'coeffs' of the latency profile holds " + std::to_string(p.coeffs[i][j]) +
                    " at [" + std::to_string(i) + "][" + std::to_string(j) + "], expected a finite number");
    if (!(p.correction[i] >= 1e-3 && p.correction[i] <= 1e3))
      throw Error(file + ": dataset 'correction' of the latency profile holds " + std::to_string(p.correction[i]) +
                  " at [" + std::to_string(i) + "], expected 0.001..1000");
  }
  if (!(p.density >= 0.01 && p.density <= 1))
    throw Error(file + ": attribute 'density' of the latency profile is " + std::to_string(p.density) +
                ", expected 0.01..1");
  if (p.block_size <= 0 || p.n_layers <= 0)
    throw Error(file + ": latency profile has an invalid model shape (n_layers " + std::to_string(p.n_layers) +
                ", block_size " + std::to_string(p.block_size) + ")");
  return p;
}

void save_latency_profile_file(const std::string& path, const LatencyProfile& p) {
  h5::quiet_errors();
  {
    h5::Id f = h5::create(path);
    h5::Id g = h5::group(f, "latency", true);
    save_latency_profile(g, p);
  }
  stamp_file_checksum(path);  // closed: the whole-file checksum (io/file_checksum.hpp)
}

LatencyProfile load_latency_profile_file(const std::string& path) {
  h5::quiet_errors();
  h5::Id f = h5::open_read(path, "a latency profile (sparsebalance profile --output)");
  if (!h5::exists(f, "latency")) throw Error(path + ": no group /latency (not a latency profile; make one with `sparsebalance profile`)");
  h5::Id g = h5::group(f, "latency", false);
  return load_latency_profile(g, path);
}

}  // namespace sb
