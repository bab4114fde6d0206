// NCCL behind the GradReducer interface: gradient sums on device buffers, one communicator over
// all ranks (one GPU each); its unique id travels over MPI.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <vector>

#include "src/comm/comm.hpp"

namespace sb {

class NcclGradReducer final : public GradReducer {
 public:
  // Collective over comm: every rank must construct it, after choosing its device.
  NcclGradReducer(const Comm& comm, size_t bucket_bytes, cudaStream_t stream);
  ~NcclGradReducer() override;
  NcclGradReducer(const NcclGradReducer&) = delete;
  NcclGradReducer& operator=(const NcclGradReducer&) = delete;
  // data: device pointer. Bucketed (bounded message size); returns with the sums in place
  // (the stream synchronised).
  void allreduce_sum(float* data, size_t n) override;
  // Overlap: starts the (bucketed) sum of data[0, n) on the reducer's own stream once `after` has
  // reached this point, and returns at once; finish() waits for every sum started. Every rank must
  // start the same ranges in the same order (NCCL matches collectives by order).
  void allreduce_sum_async(float* data, size_t n, cudaStream_t after);
  void finish();

 private:
  void sum_buckets(float* data, size_t n, cudaStream_t s);  // bounded messages, in order, on s
  ncclComm_t nccl_ = nullptr;
  size_t bucket_;
  cudaStream_t stream_;            // the compute stream (allreduce_sum runs on it)
  cudaStream_t comm_ = nullptr;    // the overlapped sums
  cudaEvent_t ready_ = nullptr;    // recorded on `after`, waited on by comm_
};

// Ranks that share one GPU cannot share an NCCL communicator: the device gradients go through host
// memory and MPI instead (slower; for testing several ranks on one GPU).
class HostStagedGradReducer final : public GradReducer {
 public:
  HostStagedGradReducer(const Comm& comm, size_t bucket_bytes, cudaStream_t stream)
      : mpi_(comm, bucket_bytes), stream_(stream) {}
  void allreduce_sum(float* data, size_t n) override;

 private:
  MpiGradReducer mpi_;
  cudaStream_t stream_;
  std::vector<float> host_;
};

}  // namespace sb
