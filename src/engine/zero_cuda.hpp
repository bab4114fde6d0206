// ZeRO-1 in the CUDA engine (train.zero = 1 with train.device = "cuda"): this rank's slice of the
// fp32 master weights, of the AdamW moments and of the reduced gradient live on the device (the
// slice is AdamW::slice(), slice_of as on the CPU, so checkpoints and resume are the same code).
// A step: the gradients are reduce-scattered into the slice (ZeroReducer: NCCL, or MPI through host
// memory when ranks share a GPU), the norm is one all-reduce of the slices' squared sums, AdamW
// updates the slice, and the updated fp32 slices are all-gathered into the model's bf16 copy and
// the fp32 copies it reads (ModelCuda::set_weights). With the reduction overlapped with the last
// backward (train.overlap_reduce: the engine reduces each layer's gradients to their owners,
// ZeroReducer::reduce_to_owners_async), the slice is read in place from the model's gradients;
// the all-gather of the weights stays after the update (it needs the whole step's gradients).
#pragma once
#include <string>
#include <vector>

#include "src/comm/comm.hpp"
#include "src/comm/nccl_cuda.hpp"
#include "src/model/model_cuda.hpp"
#include "src/engine/update.hpp"

namespace sb {

class ZeroCuda {
 public:
  // gpu: built without its fp32 master (ModelCuda(..., false)); red: the engine's reducer.
  // in_place: the engine reduces the gradients to their owners itself (reduce_gradients is then a
  // no-op and the slice gpu.grads()[lo, hi) the reduced gradient).
  ZeroCuda(const Comm& comm, ModelCuda& gpu, const ParamLayout& layout, AdamW& opt, ZeroReducer& red,
           size_t bucket_bytes, bool in_place);
  void reduce_gradients();  // gpu.grads() summed over ranks, this rank's slice of it kept
  double gradient_norm();   // the global L2 norm of the reduced gradient (collective)
  void update(double grad_norm, double lr, int64_t step);  // clip, AdamW on the slice, all-gather
  // The whole fp32 weights into w (n values; collective: every rank's slice over MPI).
  void gather_weights(std::vector<float>& w);
  // gather_weights into w, and this rank's moments into the host AdamW (its slice: m(), v()).
  void to_host(std::vector<float>& w);
  // From the host: the slice of w (n values) and the host AdamW's moments; the model's copies of w.
  void from_host(const std::vector<float>& w);
  Slice slice() const { return sh_; }
  bool own_gradient_copy() const { return own_g_; }

 private:
  const Comm& comm_;
  ModelCuda& gpu_;
  const ParamLayout& layout_;
  AdamW& opt_;
  ZeroReducer& red_;
  MpiGradReducer host_;  // gather_weights
  Slice sh_;
  DeviceArray<float> master_, m_, v_, g_;  // (slice) fp32 weights, moments, reduced gradient
  float* g_mine_ = nullptr;                // g_, or the slice of the model's gradients (one rank, in_place)
  bool own_g_ = false;                     // g_mine_ is g_ (reduce_scatter_sum fills it)
};

}  // namespace sb
