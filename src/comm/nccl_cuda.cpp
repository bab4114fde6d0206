#include "src/comm/nccl_cuda.hpp"

#include <algorithm>

#include "base/cuda_check.hpp"
#include "base/error.hpp"

// NCCL: any result other than ncclSuccess throws sb::Error naming the call, file and line.
#define SB_NCCL_CHECK(call) \
  SB_CHECK_CALL("NCCL", call, sb_nccl_r_, sb_nccl_r_ == ncclSuccess, ncclGetErrorString(sb_nccl_r_))

namespace sb {

NcclGradReducer::NcclGradReducer(const Comm& comm, size_t bucket_bytes, cudaStream_t stream)
    : bucket_(std::max<size_t>(bucket_bytes / sizeof(float), 1)), stream_(stream) {
  ncclUniqueId id;
  if (comm.root()) SB_NCCL_CHECK(ncclGetUniqueId(&id));
  comm.broadcast(std::span<unsigned char>(reinterpret_cast<unsigned char*>(&id), sizeof(id)));
  SB_NCCL_CHECK(ncclCommInitRank(&nccl_, comm.size(), id, comm.rank()));
  // Higher priority than the compute stream: a sum that can run should not queue behind the
  // backward's kernels.
  int lo = 0, hi = 0;
  SB_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  SB_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, hi));
  SB_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
}

NcclGradReducer::~NcclGradReducer() {
  if (nccl_) ncclCommDestroy(nccl_);
  if (ready_) cudaEventDestroy(ready_);
  if (comm_) cudaStreamDestroy(comm_);
}

void NcclGradReducer::sum_buckets(float* data, size_t n, cudaStream_t s) {
  for (size_t off = 0; off < n; off += bucket_)
    SB_NCCL_CHECK(ncclAllReduce(data + off, data + off, std::min(bucket_, n - off), ncclFloat, ncclSum, nccl_, s));
}

void NcclGradReducer::allreduce_sum_async(float* data, size_t n, cudaStream_t after) {
  SB_CUDA_CHECK(cudaEventRecord(ready_, after));
  SB_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));  // captures the event now: it may be re-recorded
  sum_buckets(data, n, comm_);
}

void NcclGradReducer::finish() { SB_CUDA_CHECK(cudaStreamSynchronize(comm_)); }

void NcclGradReducer::allreduce_sum(float* data, size_t n) {
  sum_buckets(data, n, stream_);
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void HostStagedGradReducer::allreduce_sum(float* data, size_t n) {
  host_.resize(n);
  SB_CUDA_CHECK(cudaMemcpyAsync(host_.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  mpi_.allreduce_sum(host_.data(), n);
  SB_CUDA_CHECK(cudaMemcpyAsync(data, host_.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace sb
