// The communicator: MPI for control, the workload exchange and (on CPU) gradients.
// GradReducer is the interface the GPU path puts NCCL behind.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace sb {

// MPI_Init/MPI_Finalize for the life of main(). Safe to construct when MPI is already up (tests).
// Before MPI_Init it selects Open MPI's fcoll/dynamic_gen2 for MPI-IO unless OMPI_MCA_fcoll is
// set: the 4.1 default, fcoll/vulcan, has hung and corrupted parallel-HDF5 writes (io/README.md,
// "Collective checkpoints").
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owner_ = false;
};

// MPI_COMM_WORLD with typed helpers; every call is checked.
class Comm {
 public:
  Comm();
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }
  // Ranks sharing this node, and this rank's index among them (device choice by local rank).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  void barrier() const;
  double allreduce_max(double x) const;
  void allreduce_sum_inplace(std::span<double> x) const;
  // Every rank's `mine` (same length on all ranks) into `all` (mine.size() * size()), in rank order.
  void allgather(std::span<const double> mine, std::span<double> all) const;
  // True on every rank when every rank passed the same value.
  bool all_equal(uint64_t x) const;
  void broadcast(std::string& s, int root = 0) const;
  void broadcast(std::span<unsigned char> bytes, int root = 0) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

// ZeRO-1: the contiguous slice [lo, hi) of a flat buffer of n values that `rank` of `ranks` owns;
// the first n % ranks ranks hold one value more.
struct Slice {
  size_t lo = 0, hi = 0;
  size_t size() const { return hi - lo; }
};
Slice shard_of(size_t n, int rank, int ranks);

// Sum of gradients over ranks, in place. The CPU path is bucketed MPI_Allreduce; the CUDA
// path is NCCL on device buffers behind the same call.
class GradReducer {
 public:
  virtual ~GradReducer() = default;
  virtual void allreduce_sum(float* data, size_t n) = 0;
};

class MpiGradReducer final : public GradReducer {
 public:
  MpiGradReducer(const Comm& comm, size_t bucket_bytes) : comm_(comm), bucket_(bucket_bytes / sizeof(float)) {}
  void allreduce_sum(float* data, size_t n) override;
  // ZeRO-1 (train.zero = 1). reduce_scatter_sum: the sum over ranks of `full` (n values on every
  // rank), this rank's slice (shard_of) into `mine`. allgather: every rank's slice of `full`, its
  // own already in place, to every rank. Both in rounds of at most a bucket (each rank's share of
  // it), so no count or displacement passes int and messages stay bounded as for the all-reduce.
  void reduce_scatter_sum(const float* full, size_t n, float* mine);
  void allgather(float* full, size_t n);

 private:
  const Comm& comm_;
  size_t bucket_;
  std::vector<float> pack_;  // one round's values, every rank's piece in rank order
};

}  // namespace sb
