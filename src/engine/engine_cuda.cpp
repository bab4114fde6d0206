// The CUDA engine: one GPU per rank (node-local rank picks it), the model in mixed precision
// (src/model/model_cuda.cpp), AdamW on fp32 master weights on the device, NCCL all-reduce; with
// train.zero = 1 the optimizer state is sliced over the ranks (src/engine/zero_cuda.hpp). With LoRA
// ([lora]) everything here acts on the trainable tensors (Model::layout(): the adapters and the
// train_also parts): the frozen base sits on the device once, in bf16 (ModelCuda::upload_base).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "base/cuda_check.hpp"
#include "base/error.hpp"
#include "base/hash.hpp"
#include "src/comm/nccl_cuda.hpp"
#include "src/model/model_cuda.hpp"
#include "src/engine/engine.hpp"
#include "src/parts/groups_cuda.hpp"
#include "src/engine/zero_cuda.hpp"

namespace sb {

namespace kc = kernels::cuda;

namespace {

// Picks this rank's GPU and checks that the model fits the CUDA kernels; errors name the keys.
// Shapes first: a config that cannot run on any GPU is reported as such, also on a machine without one.
int choose_device(int block_size, const Comm& comm, const ModelDims& d, bool* shared) {
  if (d.head_dim != 64 && d.head_dim != 128)
    throw Error("train.device = \"cuda\": the head dim model.d_model / model.n_heads = " + std::to_string(d.head_dim) +
                "; the CUDA attention kernels take 64 or 128");
  const int64_t bs = block_size;
  if (bs != 64 && bs != 128)
    throw Error("train.device = \"cuda\": attention.block_size = " + std::to_string(bs) +
                "; the CUDA attention kernels take 64 or 128");
  std::string why;
  if (!kc::device_available(&why)) throw Error("train.device = \"cuda\": no usable GPU on this node (" + why + ")");
  int n = 0;
  SB_CUDA_CHECK(cudaGetDeviceCount(&n));
  const int dev = comm.local_rank() % n;
  *shared = comm.local_size() > n;
  SB_CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

class CudaEngine final : public Engine {
 public:
  CudaEngine(const EngineSettings& s, const Comm& comm, Model<float>& model, AdamW& opt)
      : comm_(comm), model_(model), opt_(opt) {
    bool shared = false;
    const int dev = choose_device(s.block_size, comm, model.shape(), &shared);
    // zero: the master is sliced; LoRA: the model's buffers are the trainable tensors', the base apart
    gpu_ = std::make_unique<ModelCuda>(model.shape(), model.base_layout(), model.lora(), !s.zero);
    gpu_->set_exec(s.exec);
    gpu_->phases().set_on(s.phase_times);
    if (!s.zero) m_.resize(gpu_->size()), v_.resize(gpu_->size());
    const size_t bucket = size_t(s.bucket_mb * 1024 * 1024);
    ZeroReducer* zred = nullptr;
    // The reduction range by range (LayerReduction) when the layers tile their part of the buffer:
    // all-reduced (NCCL only), or with train.zero = 1 reduced to their owners (NCCL, or through the
    // host when ranks share a GPU: the same code path, without the overlap).
    layers_ = std::make_unique<LayerReduction>(model.layout(), gpu_->size(), [this](Slice r) { start_range(r); });
    const bool by_range = s.overlap_reduce && layers_->on();
    if (shared) {
      auto host = std::make_unique<HostStagedGradReducer>(comm, bucket, gpu_->stream());
      zred = host.get();
      reducer_ = std::move(host);
    } else {
      auto nccl = std::make_unique<NcclGradReducer>(comm, bucket, gpu_->stream());
      if (by_range && !s.zero) nccl_ = nccl.get();
      zred = nccl.get();
      reducer_ = std::move(nccl);
    }
    if (by_range && s.zero) owners_ = zred;
    if (s.zero) zero_ = std::make_unique<ZeroCuda>(comm, *gpu_, model.layout(), opt, *zred, bucket, owners_);
    const bool any_shared = comm.allreduce_max(shared ? 1.0 : 0.0) > 0;
    // Documents in parts by the gradients' rule (collective: every rank the same choice).
    if (s.parts) part_dev_ = std::make_unique<PartExchangeDevice>(comm, !any_shared);
    cudaDeviceProp p{};
    SB_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    gpu_name_ = p.name;
    if (comm.root()) {
      std::printf("device: %s (cuda:%d on rank 0); gradients: %s%s%s%s\n", p.name, dev,
                  any_shared && owners_ ? "MPI through host memory (more ranks than GPUs on a node), reduced to "
                                          "each slice's owner range by range after the backward"
                  : any_shared          ? "MPI through host memory (more ranks than GPUs on a node)"
                  : nccl_               ? "NCCL all-reduce, per layer during the last backward"
                  : owners_ ? "NCCL reduce to each slice's owner, per layer during the last backward"
                  : zero_   ? "NCCL reduce-scatter"
                            : "NCCL all-reduce",
                  zero_ ? ", ZeRO-1 (train.zero = 1): AdamW on this rank's slice, the weights all-gathered" : "",
                  part_dev_ ? "; split documents' K/V: " : "", part_dev_ ? part_dev_->describe() : "");
    }
  }
  void zero_grads() override { gpu_->zero_grads(); }
  // With overlap, the step's last backward starts each layer's sum as soon as that layer is done:
  // layer l's gradients are final then (the earlier micro-batches are already accumulated).
  // Documents in parts (data.long_docs = "split") exchange their rows through the device exchange
  // (src/parts/groups_cuda.hpp: NCCL, or MPI through host memory). Their batches leave the overlap
  // off: a member waiting in that exchange must not hold gradient sums that wait for it.
  MicroBatchStats forward_backward(const PackedBatch& b, const AttnSettings& a, float loss_scale, bool last) override {
    if (part_dev_) part_dev_->set_groups(part_groups);
    const PartExchangeCuda* ex = part_dev_ ? &part_dev_->exchange() : nullptr;
    if (!last || (!nccl_ && !owners_) || !b.parts.empty()) return gpu_->forward_backward(b, a, loss_scale, {}, ex);
    return gpu_->forward_backward(b, a, loss_scale, [this](int l) {
      gpu_->phases().mark(Phase::allreduce, gpu_->stream());
      layers_->layer_done(l);
    });
  }
  void set_probe(SelectionProbe p) override { gpu_->set_probe(std::move(p)); }
  void set_dropout_key(uint64_t key) override { gpu_->set_dropout_key(key); }
  MicroBatchStats forward(const PackedBatch& b, const AttnSettings& a, std::vector<int32_t>* argmax) override {
    return gpu_->forward(b, a, argmax);
  }
  void poison_gradient() override {
    const float inf = std::numeric_limits<float>::infinity();
    SB_CUDA_CHECK(cudaMemcpy(gpu_->grads(), &inf, sizeof(float), cudaMemcpyHostToDevice));
  }
  // Every rank starts the same sums in the same order: the layers from the last to the first (those
  // its last backward has not started yet, e.g. all of them on a rank without micro-batches), then
  // the parameters outside the layers (embedding, final norm, head: the embedding's gradient is
  // complete only after the whole backward). With train.zero = 1 each range goes to its owners,
  // and ZeroCuda reads this rank's slice of the gradients in place.
  void reduce_gradients() override {
    gpu_->phases().mark(Phase::allreduce, gpu_->stream());
    SB_CUDA_CHECK(cudaStreamSynchronize(gpu_->stream()));
    if (!nccl_ && !owners_) {
      if (zero_) return zero_->reduce_gradients();
      reducer_->allreduce_sum(gpu_->grads(), gpu_->size());
      return;
    }
    layers_->rest();
    if (nccl_) nccl_->finish();
    else owners_->finish();
  }
  double gradient_norm() override {
    gpu_->phases().mark(Phase::optimizer, gpu_->stream());
    if (zero_) return zero_->gradient_norm();
    return std::sqrt(kc::sum_squares(gpu_->grads(), gpu_->size(), gpu_->stream()));
  }
  // The host optimizer's step (schedule, clip factor, per-tensor arguments) with CUDA arithmetic.
  void update(double grad_norm, double lr, int64_t step) override {
    gpu_->phases().mark(Phase::optimizer, gpu_->stream());
    if (zero_) {
      zero_->update(grad_norm, lr, step);
    } else {
      opt_.step(
          model_.layout(), grad_norm, lr, step,
          [&](float c) { kc::scale_inplace(gpu_->grads(), c, gpu_->size(), gpu_->stream()); },
          [&](const ParamInfo& p, const AdamWArgs& a) {
            kc::adamw(gpu_->weights() + p.offset, gpu_->weights16() + p.offset, gpu_->grads() + p.offset,
                      m_.data() + p.offset, v_.data() + p.offset, p.size, a.lr, a.beta1, a.beta2, a.eps,
                      a.weight_decay, a.step, gpu_->stream());
          });
    }
    gpu_->phases().end(gpu_->stream());
    SB_CUDA_CHECK(cudaStreamSynchronize(gpu_->stream()));
    print_phases(step);
  }
  uint64_t weights_hash() override {
    if (zero_) zero_->gather_weights(scratch_);
    else gpu_->download_weights(scratch_);
    return fnv1a_words(scratch_.data(), scratch_.size());
  }
  void to_host() override {
    if (zero_) return zero_->to_host(model_.weights());
    gpu_->download_weights(model_.weights());
    download(m_, opt_.m());
    download(v_, opt_.v());
  }
  void from_host() override {
    gpu_->upload_base(model_.base());  // LoRA only: the frozen base, bf16 (its norms and biases fp32)
    if (zero_) return zero_->from_host(model_.weights());
    gpu_->upload_weights(model_.weights());
    upload(m_, opt_.m());
    upload(v_, opt_.v());
  }
  double allreduce_ms(size_t n, int reps) override {
    DeviceArray<float> buf(n);  // the values do not change the time: no host buffer of gradient size
    SB_CUDA_CHECK(cudaMemset(buf.data(), 0, n * sizeof(float)));
    comm_.barrier();
    const auto t = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) reducer_->allreduce_sum(buf.data(), n);  // returns with the stream synchronised
    SB_CUDA_CHECK(cudaStreamSynchronize(gpu_->stream()));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    return comm_.allreduce_max(ms / reps);
  }
  std::string device_name() override { return "cuda: " + gpu_name_ + " (" + std::to_string(comm_.size()) + " ranks)"; }
  double peak_memory_bytes() override { return gpu_->peak_memory_bytes(); }
  uint64_t base_hash() override { return gpu_->base_hash(); }
  // What this rank holds on the GPU for the parameters: the model's copies, then the optimizer's.
  std::string memory_line() override {
    const double mib = 1.0 / (1024.0 * 1024.0), n = double(gpu_->size());
    const double k = zero_ ? double(zero_->slice().size()) : n;  // parameters whose optimizer state is here
    const double model_b = n * 2 + n * 4 + double(gpu_->fp32_copy_size()) * 4;
    const bool own_g = zero_ && zero_->own_gradient_copy();
    const double opt_b = k * 8 + (zero_ ? k * 4 : 0) + (own_g ? k * 4 : 0);
    char base[120] = "";
    if (model_.lora().on())
      std::snprintf(base, sizeof base, "frozen base %.1f MiB (bf16; its norms and biases fp32), ", gpu_->base_bytes() * mib);
    // after a micro-batch: the activation and work buffers it sized (what `sparsebalance memory`
    // plans as activations), and what the peak holds beyond this line's sums (the CUDA context,
    // cuBLAS, NCCL, the block selections, the allocator's rounding)
    char act[200] = "";
    if (const double a = gpu_->buffer_bytes(); a > 0 && gpu_->peak_memory_bytes() > 0)
      std::snprintf(act, sizeof act, "; activation buffers %.1f MiB, peak beyond these %.1f MiB", a * mib,
                    (gpu_->peak_memory_bytes() - gpu_->base_bytes() - model_b - opt_b - a) * mib);
    char buf[720];
    std::snprintf(buf, sizeof buf,
                  "gpu memory per rank: %smodel %.1f MiB (bf16 weights, fp32 gradients, fp32 %s), optimizer state "
                  "%.1f MiB (%sAdamW moments of %.0f of %.0f parameters%s, train.zero = %d); peak so far %.1f MiB%s",
                  base, model_b * mib, zero_ ? "copies of the embedding, norms and biases" : "master weights", opt_b * mib,
                  zero_ ? "fp32 master weights and " : "", k, n, own_g ? ", their reduced gradient" : "",
                  zero_ ? 1 : 0, gpu_->peak_memory_bytes() * mib, act);
    return buf;
  }

 private:
  const Comm& comm_;
  std::string gpu_name_;
  void start_range(Slice r) {
    if (nccl_) nccl_->allreduce_sum_async(gpu_->grads() + r.lo, r.size(), gpu_->stream());
    else owners_->reduce_to_owners_async(gpu_->grads(), gpu_->size(), r, gpu_->stream());
  }
  void download(const DeviceArray<float>& d, std::vector<float>& h) {
    h.resize(gpu_->size());
    SB_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  void upload(DeviceArray<float>& d, const std::vector<float>& h) {
    if (h.size() != gpu_->size()) throw std::logic_error("CudaEngine: optimizer state size mismatch");
    SB_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  Model<float>& model_;
  AdamW& opt_;
  std::unique_ptr<ModelCuda> gpu_;
  DeviceArray<float> m_, v_;  // (n) AdamW moments (train.zero = 0)
  std::unique_ptr<ZeroCuda> zero_;  // train.zero = 1: the sliced master, moments and reduced gradient
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<PartExchangeDevice> part_dev_;  // data.long_docs = "split": K/V of documents in parts
  NcclGradReducer* nccl_ = nullptr;  // set when train.overlap_reduce and NCCL: sums overlap the last backward
  ZeroReducer* owners_ = nullptr;    // the same with train.zero = 1: each range reduced to its owners
  std::unique_ptr<LayerReduction> layers_;  // which ranges this step has started
  std::vector<float> scratch_;
  std::chrono::steady_clock::time_point phase_t0_ = std::chrono::steady_clock::now();

  // train.phase_times: one line per step on rank 0, GPU ms per phase since the last step's end and
  // the idle remainder of the step's wall time (src/model/phase_clock_cuda.hpp).
  void print_phases(int64_t step) {
    PhaseClock& ph = gpu_->phases();
    if (!ph.on()) return;
    ph.collect();
    const auto now = std::chrono::steady_clock::now();
    const double wall = std::chrono::duration<double, std::milli>(now - phase_t0_).count();
    phase_t0_ = now;
    double busy = 0;
    std::string line = "phases step " + std::to_string(step) + " (ms):";
    char buf[96];
    for (int p = 0; p < kPhases; ++p) {
      busy += ph.totals()[size_t(p)];
      std::snprintf(buf, sizeof buf, " %s %.1f |", kPhaseNames[size_t(p)], ph.totals()[size_t(p)]);
      line += buf;
    }
    std::snprintf(buf, sizeof buf, " idle %.1f | wall %.1f", std::max(0.0, wall - busy), wall);
    if (comm_.root()) std::printf("%s%s\n", line.c_str(), buf);
    ph.totals().fill(0.0);
  }
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const EngineSettings& s, const Comm& comm, Model<float>& model, AdamW& opt) {
  return std::make_unique<CudaEngine>(s, comm, model, opt);
}

}  // namespace sb
