// Latency predictor (DESIGN.md, "Latency predictor"): per-part linear models of a step's time,
// fitted from profiled samples, corrected online from measured times.
//
//   attention (fwd+bwd, per layer)  t = c0 + c1*tokens + c2*kept_blocks*Bs^2
//   gating (per layer)              t = c0 + c1*tokens + c2*block_pairs        (causal pairs)
//   linear (whole model)            t = c0 + c1*tokens                          (GEMMs, norms, loss)
//   allreduce (per step)            t = c0 + c1*bytes
// Each part's prediction is multiplied by its correction factor, an EMA of measured/predicted.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <hdf5.h>

#include "io/latency_profile.hpp"
#include "src/balance/segment.hpp"

namespace sb {

enum class Part { Attention = 0, Gating = 1, Linear = 2, AllReduce = 3 };
const char* part_name(Part p);

// How a member of a split document's group gates it (context parallelism): OwnRows, only its own
// query blocks, its gating split with its rows (the CPU engine, src/model/part_attention.cpp);
// Whole, the whole document, every member a full copy (the CUDA engine, part_attention_cuda.cpp).
enum class PartGating { Whole, OwnRows };

struct ModelShape {
  int n_layers = 1;
  int block_size = 128;   // Bs, tokens
  int local_blocks = 1;   // w
};

// One profiled measurement: the part's features (see above; unused ones 0) and its time.
struct LatencySample {
  double tokens = 0;  // tokens (attention/gating/linear) or bytes (allreduce)
  double x2 = 0;      // kept_blocks*Bs^2 (attention) or block_pairs (gating); 0 otherwise
  double ms = 0;
};

struct FitReport {
  std::array<double, 3> coeffs{};
  double heldout_error = 0;  // mean |pred - meas| / meas over every 5th sample, held out of the fit
  int samples = 0;
};

// Time split of one micro-batch (all layers), before summing.
struct PartTimes {
  double attention = 0, gating = 0, linear = 0;
  double total() const { return attention + gating + linear; }
};

class LatencyModel {
 public:
  // Analytic defaults for this shape: a 7B-class decoder on one GPU (src/balance/README.md, "The default cost model").
  explicit LatencyModel(ModelShape shape = {});
  // From a stored profile (shape and coefficients as recorded).
  static LatencyModel from_profile(const LatencyProfile& p);

  const ModelShape& shape() const { return shape_; }
  const LatencyProfile& profile() const { return p_; }
  void set_coeffs(Part part, std::array<double, 3> c) { p_.coeffs[int(part)] = c; }
  const std::array<double, 3>& coeffs(Part part) const { return p_.coeffs[int(part)]; }
  double correction(Part part) const { return p_.correction[int(part)]; }
  void set_device(const std::string& d) { p_.device = d; }
  void set_ema(double ema) { ema_ = ema; }  // balance.ema
  // A plain option of the costs of documents in parts (split_cost, part_gating_ms, build_items),
  // not saved with the profile: the trainer sets it from train.device, simulate from its config.
  void set_part_gating(PartGating g) { part_gating_ = g; }
  PartGating part_gating() const { return part_gating_; }
  // Hybrid layers (attention.dense_layers), a plain option as part gating: dense (n_layers flags, or
  // empty: none) marks the layers that keep every causal block and do not gate. Every cost below
  // counts those layers dense (attention over the causal blocks, no gating) whatever the budget;
  // DST tunes only the others. Throws when the size is neither 0 nor n_layers.
  void set_dense_layers(std::vector<uint8_t> dense);
  const std::vector<uint8_t>& dense_layers() const { return dense_; }
  bool dense_at(int l) const { return size_t(l) < dense_.size() && dense_[size_t(l)]; }
  int sparse_layers() const { return sparse_layers_; }  // layers that gate (n_layers without the dense ones)
  double dense_share() const { return 1.0 - double(sparse_layers_) / shape_.n_layers; }

  // Expected kept key blocks of one sequence of `len` tokens at budget k, summed over its query
  // blocks: anchors (sink, diagonal, w local) + density * min(k, remaining causal blocks).
  double kept_blocks(int64_t len, int k) const;
  // Causal block pairs of one sequence (what dense attention and gating touch).
  static double causal_blocks(int64_t len, int block_size);
  // Those of its query blocks over rows [b, e) (b on the block grid): a group member's own rows.
  static double causal_blocks(int64_t b, int64_t e, int block_size) {
    return causal_blocks(e, block_size) - causal_blocks(b, block_size);
  }
  // The gating (all layers) of one member's part of a split document of doc_len tokens (`part`'s
  // segments: its rows [begin, begin + len)), as part_gating() says the engine runs it: its own
  // rows' block pairs (OwnRows) or the whole document's (Whole).
  double part_gating_ms(const MicroBatch& part, int64_t doc_len) const;

  // One part's corrected time from its features.
  double part_ms(Part part, double tokens, double x2 = 0) const;
  // Time of one micro-batch: per-layer budgets (size n_layers) or one budget for all layers.
  PartTimes micro_batch_parts(const MicroBatch& mb, std::span<const int> k_per_layer) const;
  double micro_batch_ms(const MicroBatch& mb, std::span<const int> k_per_layer) const;
  double micro_batch_ms(const MicroBatch& mb, int k) const;
  // Attention + gating time of one layer of a micro-batch whose kept blocks sum to `kept`
  // (used by DST, which tunes per layer).
  double layer_ms(int64_t tokens, double kept, double pairs) const;
  // Cost of one segment alone (all layers, no per-micro-batch constant): SAB's sparse cost.
  double segment_cost(int64_t len, int k) const;
  // Dense cost a*L + b*L^2 (every causal block kept): the `quadratic` baseline's cost.
  double dense_segment_cost(int64_t len) const;
  double allreduce_ms(double bytes) const { return part_ms(Part::AllReduce, bytes); }

  // Least-squares fit of one part from samples (c2 ignored for linear/allreduce). Every 5th sample
  // is held out to measure the error, then all samples are fitted. Sets the coefficients,
  // resets the part's correction to 1. Throws sb::Error with fewer samples than coefficients.
  FitReport fit(Part part, std::span<const LatencySample> samples);

  // Online correction: `predicted_ms` is what this model predicted (with its current correction)
  // for a part, `measured_ms` what it took. correction *= (1-ema) + ema*measured/predicted.
  void observe(Part part, double predicted_ms, double measured_ms);
  // Online density: `predicted_candidates` = kept_blocks - anchors at density 1 (what the budget
  // allows), `measured_candidates` = blocks the gating kept beyond the anchors (per kv head).
  void observe_density(double predicted_candidates, double measured_candidates);
  double density() const { return p_.density; }
  // Anchor blocks of a sequence (always kept).
  double anchor_blocks(int64_t len) const;

  // HDF5 (io/latency_profile.hpp). load checks the shape against `expect` when given: a different
  // block_size or local_blocks is an error (the features change meaning); a different n_layers
  // is an error too (the linear part is whole-model). Messages name the file and the field.
  void save(hid_t group) const;
  // load: the group a checkpoint carries (its shape message says how to resume); load_file: a
  // balance.profile or simulate --profile file.
  static LatencyModel load(hid_t group, const std::string& file, const ModelShape* expect = nullptr);
  static LatencyModel load_file(const std::string& path, const ModelShape* expect = nullptr);

 private:
  ModelShape shape_;
  LatencyProfile p_;
  double ema_ = 0.3;
  PartGating part_gating_ = PartGating::Whole;
  std::vector<uint8_t> dense_;  // (n_layers) or empty
  int sparse_layers_ = 0;
};

}  // namespace sb
