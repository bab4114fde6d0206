// compute, reduce, update: the part of the step that touches parameters, on one device.
// The trainer owns the host model (layout, init, checkpoints) and the AdamW state; an Engine runs
// forward/backward, the gradient all-reduce and the update where the model lives:
//   CPU  (engine.cpp):      on the host model itself, MPI all-reduce;
//   CUDA (engine_cuda.cpp): weights, gradients and moments on the GPU, NCCL all-reduce (train.zero
//                           = 1: sliced, zero_cuda.hpp); the host copies are refreshed only when
//                           asked (checkpoints, sync checks).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/comm/comm.hpp"
#include "src/model/model.hpp"
#include "src/engine/update.hpp"

namespace sb {

class PartGroups;

// What an engine acts on, from the typed settings (Settings::engine(), src/train/settings.hpp).
struct EngineSettings {
  std::string device = "cpu";  // train.device: "cpu" | "cuda"
  double bucket_mb = 4;        // train.bucket_mb
  bool overlap_reduce = true;  // train.overlap_reduce
  bool zero = false;           // train.zero = 1: AdamW state sliced over the ranks (ZeRO-1)
  ModelExec exec;              // model.lm_head_chunk, train.recompute
  bool phase_times = false;    // train.phase_times: per-phase GPU times each step (cuda)
  int block_size = 32;         // attention.block_size (the CUDA kernels take 64 or 128)
  bool parts = false;          // data.long_docs = "split": documents split into parts over rank groups
};

class Engine {
 public:
  virtual ~Engine() = default;
  // The exchange of split documents' rows (data.long_docs = "split", src/parts/groups.hpp), for a
  // batch with parts: the CPU engine passes part_exchange to the model; the CUDA one runs its
  // device exchange (src/parts/groups_cuda.hpp) over the groups.
  const PartExchange<float>* part_exchange = nullptr;
  const PartGroups* part_groups = nullptr;
  virtual void zero_grads() = 0;
  // Gradients accumulate over the step's micro-batches, scaled by loss_scale (Model::forward_backward).
  // `last`: the step's last micro-batch on this rank; an engine may then start reducing the
  // gradients that are final (reduce_gradients completes it).
  virtual MicroBatchStats forward_backward(const PackedBatch& b, const AttnSettings& a, float loss_scale,
                                           bool last = false) = 0;
  // Forward only (eval): as Model::forward, `argmax` (optional) gets every token's greedy prediction.
  virtual MicroBatchStats forward(const PackedBatch& b, const AttnSettings& a, std::vector<int32_t>* argmax) = 0;
  // The diagnostics' probe (eval --diagnose, model.hpp SelectionProbe), empty: none. The CUDA engine
  // gates on the host while one is set (the probe reads and changes a host selection).
  virtual void set_probe(SelectionProbe p) = 0;
  // lora.dropout > 0: the draw of the next forward_backward (kernels::dropout_micro_batch_key).
  virtual void set_dropout_key(uint64_t key) = 0;
  // Fault injection (train.inject_nan_step): the first gradient becomes +inf.
  virtual void poison_gradient() = 0;
  virtual void reduce_gradients() = 0;  // sum over ranks, in place
  virtual double gradient_norm() = 0;   // global L2 norm (after the reduction)
  // Clip to grad_clip given the norm, then one AdamW step.
  virtual void update(double grad_norm, double lr, int64_t step) = 0;
  virtual uint64_t weights_hash() = 0;  // fnv1a_words of the fp32 weights (the sync check)
  // LoRA: fnv1a_words of the frozen base as this engine holds it (the CPU's fp32 Model::base(), the
  // GPU's bf16 copy with its fp32 norms and biases), unchanged by any step; 0 without LoRA.
  virtual uint64_t base_hash() = 0;
  virtual void to_host() = 0;           // weights and moments -> host model and AdamW (checkpoints)
  virtual void from_host() = 0;         // host model and AdamW -> device (after init or resume)
  // Mean time (ms, the slowest rank's) of `reps` all-reduces of n floats where the gradients live,
  // through the gradient reducer (profile). Collective.
  virtual double allreduce_ms(size_t n, int reps) = 0;
  // What runs it, for the latency profile: "cpu: <model> (<n> ranks)" or "cuda: <GPU> (<n> ranks)".
  virtual std::string device_name() = 0;
  // High-water mark of this rank's device memory in use (bytes), 0 where not measured (the CPU).
  virtual double peak_memory_bytes() { return 0; }
  // The device memory this rank holds for the parameters and the optimizer ("" on the CPU, where
  // memory_line of update.hpp says it), for the start line and the summary.
  virtual std::string memory_line() { return ""; }
};

// By train.device: "cpu" or "cuda" (one GPU per rank, chosen by node-local rank). The engine keeps
// references to model, opt and comm. Errors name train.device when this build or machine cannot.
std::unique_ptr<Engine> make_engine(const EngineSettings& s, const Comm& comm, Model<float>& model, AdamW& opt);

// The ranges of the flat gradient buffer (n values) that the reduction runs over, in the order
// every rank starts them: the layers from the last to the first (the order the backward finishes
// them), then the parameters before them (embedding) and after them (final norm, head). One range
// [0, n) when the layers' ranges do not follow one another without gaps. They tile [0, n).
std::vector<Slice> reduction_ranges(const ParamLayout& layout, size_t n);

// The reduction range by range over reduction_ranges, both engines: layer_done(l) starts layer l's
// range as the step's last backward finishes it, rest() starts the layers not started yet (last
// first: e.g. all of them on a rank without micro-batches) and then the rest, so every rank starts
// the same ranges in the same order whatever its micro-batches. `start` begins one range's
// reduction (it may return before it is done; the engine waits after rest()).
class LayerReduction {
 public:
  LayerReduction(const ParamLayout& layout, size_t n, std::function<void(Slice)> start);
  bool on() const { return ranges_.size() > 1; }  // the layers tile their part of the buffer
  void layer_done(int l);
  void rest();  // ends the step's starts; the next step starts afresh

 private:
  std::vector<Slice> ranges_;  // layer l at L - 1 - l, then the rest
  std::vector<char> started_;  // per layer, this step
  std::function<void(Slice)> start_;
};

// "cpu: <model name> (<n> ranks)" from /proc/cpuinfo.
std::string cpu_device_name(const Comm& comm);

#ifdef SB_WITH_CUDA
std::unique_ptr<Engine> make_cuda_engine(const EngineSettings& s, const Comm& comm, Model<float>& model, AdamW& opt);
#endif

}  // namespace sb
