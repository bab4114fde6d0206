// NCCL behind the GradReducer interface: gradient sums on device buffers, one communicator over
// all ranks (one GPU each); its unique id travels over MPI.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "src/comm/comm.hpp"

namespace sb {

// ZeRO-1 on device buffers (train.zero = 1; the slices of slice_of, in the rounds of ZeroRounds).
// reduce_scatter_sum: the sum over ranks of `full` (n values on every rank), this rank's slice into
// `mine`. allgather: every rank's slice `mine` to every rank, delivered to sink(piece, lo, len) as
// device pieces of the full buffer ([lo, lo + len), fp32), in order on the stream; a piece is valid
// only for the work sink enqueues on the stream. Both return with the stream synchronised.
// reduce_to_owners_async (the reduction overlapped with the backward, train.overlap_reduce): the sum
// over ranks of full[range] (n values on every rank) to the owners of its parts (owner_pieces,
// src/comm/comm.hpp), in place: once finish() returns, this rank's part of range holds the sum (the
// rest of range is left unspecified). Starts once `after` reaches this point; every rank must start
// the same ranges in the same order. Ranges tiling [0, n) leave full[slice_of] reduced, in place of
// reduce_scatter_sum's output.
class ZeroReducer {
 public:
  using Sink = std::function<void(const float* piece, size_t lo, size_t len)>;
  virtual ~ZeroReducer() = default;
  virtual void reduce_scatter_sum(const float* full, size_t n, float* mine) = 0;
  virtual void allgather(const float* mine, size_t n, const Sink& sink) = 0;
  virtual void reduce_to_owners_async(float* full, size_t n, Slice range, cudaStream_t after) = 0;
  virtual void finish() = 0;  // every sum started (either kind) is done
};

class NcclGradReducer final : public GradReducer, public ZeroReducer {
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
  void finish() override;
  // ncclReduceScatter / ncclAllGather per round: NCCL takes equal counts, so each round's pieces
  // travel padded to w values through a staging buffer of (ranks + 1) * w.
  void reduce_scatter_sum(const float* full, size_t n, float* mine) override;
  void allgather(const float* mine, size_t n, const Sink& sink) override;
  // One ncclReduce per owner piece (root = its owner), in groups: the pieces of a range to their
  // owners at once, on the reducer's own stream as allreduce_sum_async.
  void reduce_to_owners_async(float* full, size_t n, Slice range, cudaStream_t after) override;

 private:
  void sum_buckets(float* data, size_t n, cudaStream_t s);  // bounded messages, in order, on s
  void wait_for(cudaStream_t after);                        // comm_ waits for `after` to get here
  ncclComm_t nccl_ = nullptr;
  size_t bucket_;
  cudaStream_t stream_;            // the compute stream (allreduce_sum runs on it)
  cudaStream_t comm_ = nullptr;    // the overlapped sums
  cudaEvent_t ready_ = nullptr;    // recorded on `after`, waited on by comm_
  int rank_, ranks_;
  float* stage_ = nullptr;  // ZeRO: (ranks + 1) * w, allocated on first use
  size_t stage_n_ = 0;
  float* stage(size_t n);
  void each_round(size_t n, const std::function<void(const ZeroRounds&, size_t c, size_t wc, float* stage)>& f);
};

// Ranks that share one GPU cannot share an NCCL communicator: the device gradients go through host
// memory and MPI instead (slower; for testing several ranks on one GPU).
// ZeRO-1 the same way: MpiGradReducer's reduce-scatter and all-gather on a host copy of the buffer.
// reduce_to_owners_async only records the range; finish() reduces the recorded ranges in order
// (MpiGradReducer::reduce_to_owners on a host copy of each), after the backward: reducing inside
// it would stop the GPU at every layer, and this path is for correctness, not speed.
class HostStagedGradReducer final : public GradReducer, public ZeroReducer {
 public:
  HostStagedGradReducer(const Comm& comm, size_t bucket_bytes, cudaStream_t stream)
      : comm_(comm), mpi_(comm, bucket_bytes), bucket_(std::max<size_t>(bucket_bytes / sizeof(float), 1)),
        stream_(stream) {}
  ~HostStagedGradReducer() override;
  HostStagedGradReducer(const HostStagedGradReducer&) = delete;
  HostStagedGradReducer& operator=(const HostStagedGradReducer&) = delete;
  void allreduce_sum(float* data, size_t n) override;
  void reduce_scatter_sum(const float* full, size_t n, float* mine) override;
  void allgather(const float* mine, size_t n, const Sink& sink) override;
  void reduce_to_owners_async(float* full, size_t n, Slice range, cudaStream_t after) override;
  void finish() override;

 private:
  const Comm& comm_;
  MpiGradReducer mpi_;
  size_t bucket_;
  cudaStream_t stream_;
  std::vector<float> host_, host_mine_;
  struct Pending {
    float* full;
    size_t n;
    Slice range;
  };
  std::vector<Pending> pending_;  // reduce_to_owners_async's ranges, reduced at finish()
  float* piece_ = nullptr;  // allgather: one bucket back on the device
};

}  // namespace sb
