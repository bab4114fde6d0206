#include "src/comm/nccl_cuda.hpp"

#include <algorithm>

#include "base/cuda_check.hpp"
#include "base/error.hpp"

// NCCL: any result other than ncclSuccess throws sb::Error naming the call, file and line.
#define SB_NCCL_CHECK(call) \
  SB_CHECK_CALL("NCCL", call, sb_nccl_r_, sb_nccl_r_ == ncclSuccess, ncclGetErrorString(sb_nccl_r_))

namespace sb {

NcclGradReducer::NcclGradReducer(const Comm& comm, size_t bucket_bytes, cudaStream_t stream)
    : bucket_(std::max<size_t>(bucket_bytes / sizeof(float), 1)), stream_(stream), rank_(comm.rank()),
      ranks_(comm.size()) {
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
  if (stage_) cudaFree(stage_);
}

void NcclGradReducer::sum_buckets(float* data, size_t n, cudaStream_t s) {
  for (size_t off = 0; off < n; off += bucket_)
    SB_NCCL_CHECK(ncclAllReduce(data + off, data + off, std::min(bucket_, n - off), ncclFloat, ncclSum, nccl_, s));
}

void NcclGradReducer::wait_for(cudaStream_t after) {
  SB_CUDA_CHECK(cudaEventRecord(ready_, after));
  SB_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));  // captures the event now: it may be re-recorded
}

void NcclGradReducer::allreduce_sum_async(float* data, size_t n, cudaStream_t after) {
  wait_for(after);
  sum_buckets(data, n, comm_);
}

// A group of reduces with different roots runs them together; groups of at most kGroup keep
// each launch's op count small whatever the rank count (a range spans many owners at scale).
void NcclGradReducer::reduce_to_owners_async(float* full, size_t n, Slice range, cudaStream_t after) {
  if (ranks_ == 1) return;  // the whole buffer is this rank's, already summed
  wait_for(after);
  constexpr size_t kGroup = 64;
  const std::vector<OwnerPiece> pieces = owner_pieces(n, range, bucket_, ranks_);
  for (size_t g = 0; g < pieces.size(); g += kGroup) {
    SB_NCCL_CHECK(ncclGroupStart());
    for (size_t i = g; i < std::min(pieces.size(), g + kGroup); ++i) {
      float* at = full + pieces[i].s.lo;  // in place: the root's sum lands in its own buffer
      SB_NCCL_CHECK(ncclReduce(at, at, pieces[i].s.size(), ncclFloat, ncclSum, pieces[i].owner, nccl_, comm_));
    }
    SB_NCCL_CHECK(ncclGroupEnd());
  }
}

void NcclGradReducer::finish() { SB_CUDA_CHECK(cudaStreamSynchronize(comm_)); }

void NcclGradReducer::allreduce_sum(float* data, size_t n) {
  sum_buckets(data, n, stream_);
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

float* NcclGradReducer::stage(size_t n) {
  if (n > stage_n_) {
    SB_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer may still be in use
    if (stage_) SB_CUDA_CHECK(cudaFree(stage_));
    stage_ = nullptr;
    SB_CUDA_CHECK(cudaMalloc(&stage_, n * sizeof(float)));
    stage_n_ = n;
  }
  return stage_;
}

static void copy_d2d(float* to, const float* from, size_t n, cudaStream_t s) {
  if (n > 0 && to != from) SB_CUDA_CHECK(cudaMemcpyAsync(to, from, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
}

// Every round of a ZeRO collective over n values (ZeroRounds) with its width wc (the largest
// piece, rank 0's) and a staging buffer of (ranks + 1) * wc.
void NcclGradReducer::each_round(size_t n, const std::function<void(const ZeroRounds&, size_t, size_t, float*)>& f) {
  const ZeroRounds rd(n, bucket_, ranks_);
  for (size_t c = 0; c < rd.rounds; ++c) {
    const size_t wc = rd.piece(0, c).size();
    f(rd, c, wc, stage((size_t(ranks_) + 1) * wc));
  }
}

// Round c: block r of the send buffer holds rank r's piece (padded to wc); this rank's sum arrives
// in the block after them.
void NcclGradReducer::reduce_scatter_sum(const float* full, size_t n, float* mine) {
  const Slice my = slice_of(n, rank_, ranks_);
  const size_t R = size_t(ranks_);
  if (ranks_ == 1) copy_d2d(mine, full, n, stream_);
  else
    each_round(n, [&](const ZeroRounds& rd, size_t c, size_t wc, float* st) {
      for (int r = 0; r < ranks_; ++r) {
        const Slice p = rd.piece(r, c);
        copy_d2d(st + size_t(r) * wc, full + p.lo, p.size(), stream_);
      }
      SB_NCCL_CHECK(ncclReduceScatter(st, st + R * wc, wc, ncclFloat, ncclSum, nccl_, stream_));
      const Slice mp = rd.piece(rank_, c);
      copy_d2d(mine + (mp.lo - my.lo), st + R * wc, mp.size(), stream_);
    });
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Round c: this rank's piece (padded to wc) from the last block to block `rank` of every rank.
void NcclGradReducer::allgather(const float* mine, size_t n, const Sink& sink) {
  const Slice my = slice_of(n, rank_, ranks_);
  const size_t R = size_t(ranks_);
  if (ranks_ == 1 && n > 0) sink(mine, 0, n);
  else if (ranks_ > 1)
    each_round(n, [&](const ZeroRounds& rd, size_t c, size_t wc, float* st) {
      const Slice mp = rd.piece(rank_, c);
      copy_d2d(st + R * wc, mine + (mp.lo - my.lo), mp.size(), stream_);
      SB_NCCL_CHECK(ncclAllGather(st + R * wc, st, wc, ncclFloat, nccl_, stream_));
      for (int r = 0; r < ranks_; ++r)
        if (const Slice p = rd.piece(r, c); p.size() > 0) sink(st + size_t(r) * wc, p.lo, p.size());
    });
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

HostStagedGradReducer::~HostStagedGradReducer() {
  if (piece_) cudaFree(piece_);
}

void HostStagedGradReducer::reduce_scatter_sum(const float* full, size_t n, float* mine) {
  const Slice my = slice_of(n, comm_.rank(), comm_.size());
  host_.resize(n), host_mine_.resize(my.size());
  SB_CUDA_CHECK(cudaMemcpyAsync(host_.data(), full, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  mpi_.reduce_scatter_sum(host_.data(), n, host_mine_.data());
  SB_CUDA_CHECK(
      cudaMemcpyAsync(mine, host_mine_.data(), my.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// The whole buffer gathered on the host, then back to the device a bucket at a time.
void HostStagedGradReducer::allgather(const float* mine, size_t n, const Sink& sink) {
  const Slice my = slice_of(n, comm_.rank(), comm_.size());
  host_.resize(n);
  SB_CUDA_CHECK(
      cudaMemcpyAsync(host_.data() + my.lo, mine, my.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  mpi_.allgather(host_.data(), n);
  if (!piece_) SB_CUDA_CHECK(cudaMalloc(&piece_, bucket_ * sizeof(float)));  // one bucket, whatever n
  for (size_t off = 0; off < n; off += bucket_) {
    const size_t len = std::min(bucket_, n - off);
    SB_CUDA_CHECK(cudaMemcpyAsync(piece_, host_.data() + off, len * sizeof(float), cudaMemcpyHostToDevice, stream_));
    sink(piece_, off, len);
  }
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void HostStagedGradReducer::reduce_to_owners_async(float* full, size_t n, Slice range, cudaStream_t) {
  pending_.push_back({full, n, range});
}

// Each range through the host: its values down, the owners' sums by MPI, this rank's part back.
void HostStagedGradReducer::finish() {
  for (const Pending& p : pending_) {
    const Slice r = p.range, my = slice_of(p.n, comm_.rank(), comm_.size());
    const Slice mine{std::max(r.lo, my.lo), std::min(r.hi, my.hi)};
    host_.resize(p.n);
    SB_CUDA_CHECK(cudaMemcpyAsync(host_.data() + r.lo, p.full + r.lo, r.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                  stream_));
    SB_CUDA_CHECK(cudaStreamSynchronize(stream_));  // also the backward that wrote the gradients
    mpi_.reduce_to_owners(host_.data(), p.n, r);
    if (mine.lo < mine.hi)
      SB_CUDA_CHECK(cudaMemcpyAsync(p.full + mine.lo, host_.data() + mine.lo, mine.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
  }
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  pending_.clear();
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
