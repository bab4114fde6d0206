#include "src/engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>

#include "base/error.hpp"
#include "base/hash.hpp"

namespace sb {

namespace {

// The host path: Model<float> with OpenBLAS/Kokkos kernels, bucketed MPI_Allreduce. With
// train.zero = 1 (opt sliced, ZeRO-1): the gradients are reduced to their owners range by range
// as the CUDA engine does (LayerReduction: each layer as the step's last backward finishes it, the
// rest in the reduce phase; MPI_Reduce per piece, synchronous), this rank's slice is kept, the norm
// is one all-reduce of the slices' squared sums, AdamW updates the slice of the weights and the
// updated slices are all-gathered, so every rank again holds every weight.
class CpuEngine final : public Engine {
 public:
  CpuEngine(const EngineSettings& t, const Comm& comm, Model<float>& model, AdamW& opt)
      : comm_(comm), model_(model), opt_(opt), reducer_(comm, size_t(t.bucket_mb * 1024 * 1024)), zero_(t.zero),
        owners_(model.layout(), model.weights().size(), [this](Slice r) {
          reducer_.reduce_to_owners(model_.grads().data(), model_.grads().size(), r);
        }) {
    if (zero_) g_mine_.resize(opt.slice().size());
  }
  void zero_grads() override { model_.zero_grads(); }
  // As on the GPU, a batch with parts leaves the per-layer start off (its members exchange rows
  // inside the backward).
  MicroBatchStats forward_backward(const PackedBatch& b, const AttnSettings& a, float loss_scale, bool last) override {
    if (!zero_ || !last || !b.parts.empty()) return model_.forward_backward(b, a, loss_scale, part_exchange);
    return model_.forward_backward(b, a, loss_scale, part_exchange, [this](int l) { owners_.layer_done(l); });
  }
  void set_probe(SelectionProbe p) override { model_.set_probe(std::move(p)); }
  void set_dropout_key(uint64_t key) override { model_.set_dropout_key(key); }
  MicroBatchStats forward(const PackedBatch& b, const AttnSettings& a, std::vector<int32_t>* argmax) override {
    return model_.forward(b, a, argmax);
  }
  void poison_gradient() override {
    if (!model_.grads().empty()) model_.grads()[0] = std::numeric_limits<float>::infinity();
  }
  void reduce_gradients() override {
    std::vector<float>& g = model_.grads();
    if (!zero_) return reducer_.allreduce_sum(g.data(), g.size());
    owners_.rest();
    const Slice sh = opt_.slice();
    std::copy(g.begin() + long(sh.lo), g.begin() + long(sh.hi), g_mine_.begin());
  }
  double gradient_norm() override {
    if (!zero_) return global_norm(model_.grads());
    double s = 0;
    for (float x : g_mine_) s += double(x) * double(x);
    comm_.allreduce_sum_inplace(std::span<double>(&s, 1));
    return std::sqrt(s);
  }
  void update(double grad_norm, double lr, int64_t step) override {
    if (!zero_) return opt_.step(model_, model_.grads(), grad_norm, lr, step);
    opt_.step(model_, g_mine_, grad_norm, lr, step);
    reducer_.allgather(model_.weights().data(), model_.weights().size());
  }
  uint64_t weights_hash() override {
    return fnv1a_words(model_.weights().data(), model_.weights().size());
  }
  uint64_t base_hash() override {
    return model_.lora().on() ? fnv1a_words(model_.base().data(), model_.base().size()) : 0;
  }
  void to_host() override {}
  void from_host() override {}
  double allreduce_ms(size_t n, int reps) override {
    std::vector<float> buf(n, 1.0f);
    comm_.barrier();
    const auto t = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) reducer_.allreduce_sum(buf.data(), n);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    return comm_.allreduce_max(ms / reps);
  }
  std::string device_name() override { return cpu_device_name(comm_); }

 private:
  const Comm& comm_;
  Model<float>& model_;
  AdamW& opt_;
  MpiGradReducer reducer_;
  bool zero_;
  std::vector<float> g_mine_;  // zero: the reduced gradient of opt_.slice()
  LayerReduction owners_;      // zero: the gradients reduced to their owners, range by range
};

}  // namespace

std::vector<Slice> reduction_ranges(const ParamLayout& layout, size_t n) {
  const int L = int(layout.layers.size());
  bool tile = L > 0;
  for (int l = 0; tile && l + 1 < L; ++l) tile = layout.layer_range(l).second == layout.layer_range(l + 1).first;
  if (!tile) return {{0, n}};
  std::vector<Slice> out;
  for (int l = L - 1; l >= 0; --l) out.push_back({layout.layer_range(l).first, layout.layer_range(l).second});
  const size_t first = out.back().lo, end = out.front().hi;
  if (first > 0) out.push_back({0, first});
  if (end < n) out.push_back({end, n});
  return out;
}

LayerReduction::LayerReduction(const ParamLayout& layout, size_t n, std::function<void(Slice)> start)
    : ranges_(reduction_ranges(layout, n)), started_(layout.layers.size(), 0), start_(std::move(start)) {}

void LayerReduction::layer_done(int l) {
  if (!on() || started_[size_t(l)]) return;
  start_(ranges_[started_.size() - 1 - size_t(l)]);
  started_[size_t(l)] = 1;
}

void LayerReduction::rest() {
  if (!on()) return start_(ranges_[0]);
  for (int l = int(started_.size()) - 1; l >= 0; --l) layer_done(l);
  for (size_t i = started_.size(); i < ranges_.size(); ++i) start_(ranges_[i]);
  std::fill(started_.begin(), started_.end(), 0);
}

std::string cpu_device_name(const Comm& comm) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      name = line.substr(line.find(':') + 2);
      break;
    }
  return "cpu: " + name + " (" + std::to_string(comm.size()) + " ranks)";
}

std::unique_ptr<Engine> make_engine(const EngineSettings& s, const Comm& comm, Model<float>& model, AdamW& opt) {
  const std::string& dev = s.device;
  model.set_exec(s.exec);  // the CPU model runs it; the CUDA engine passes it to its model
  if (dev == "cpu") return std::make_unique<CpuEngine>(s, comm, model, opt);
#ifdef SB_WITH_CUDA
  if (dev == "cuda") return make_cuda_engine(s, comm, model, opt);
#endif
  throw Error("train.device = \"" + dev + "\": this build has no CUDA support (configure with -DSB_CUDA=ON and nvcc "
              "on PATH; README.md, 'GPU build')");
}

}  // namespace sb
