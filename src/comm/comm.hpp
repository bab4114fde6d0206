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
Slice slice_of(size_t n, int rank, int ranks);

// Round c of a bucketed ZeRO collective over n values: rank r's piece is the part
// [lo_r + c*w, lo_r + (c+1)*w) of its slice (empty once past it); w <= bucket / ranks and
// w * ranks fits an int. The same rounds on every rank (MPI here, NCCL in src/comm/nccl_cuda.cpp).
struct ZeroRounds {
  size_t n, w, rounds;
  int ranks;
  ZeroRounds(size_t n, size_t bucket, int ranks);
  Slice piece(int r, size_t c) const;
};

// ZeRO-1 reduced range by range (a layer's gradients, as the last backward finishes it; see
// CudaEngine): owner r's part of `range` is slice_of(n, r, ranks) ∩ range, reduced to r alone.
// owner_pieces lists the non-empty parts in rank order, each cut into pieces of at most `bucket`
// values (and INT_MAX), so messages stay bounded as for the all-reduce. Every rank computes the
// same list, so the collectives match by order; ranges that tile [0, n) reduce each rank's
// whole slice.
struct OwnerPiece {
  int owner;
  Slice s;
};
std::vector<OwnerPiece> owner_pieces(size_t n, Slice range, size_t bucket, int ranks);

// A group of ranks cut out of MPI_COMM_WORLD (MPI_Comm_split): the context-parallel group of a
// split document (src/parts/groups.hpp). Collective over every rank of the world to create;
// a rank passing color < 0 belongs to none (valid() is false).
class Group {
 public:
  Group(const Comm& world, int color, int key);
  ~Group();
  Group(Group&& o) noexcept;
  Group& operator=(Group&&) = delete;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  bool valid() const { return comm_ != MPI_COMM_NULL; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi() const { return comm_; }  // the point-to-point of src/comm/row_exchange.hpp, NCCL's id
  // Every member's `mine` (counts[r] values for member r) into `all` (sum of counts), member order.
  // (Rows of documents in parts move by row plans instead: src/comm/row_exchange.hpp.)
  void allgatherv(std::span<const int32_t> mine, std::span<int32_t> all, std::span<const int> counts) const;
  // Every member's x, in member order.
  std::vector<int> allgather(int x) const;
  // Personalised exchange: `send` holds send_counts[r] values for member r (member order), `recv`
  // receives recv_counts[r] values from member r (member order). Counts must match pairwise.
  void alltoallv(std::span<const float> send, std::span<const int> send_counts, std::span<float> recv,
                 std::span<const int> recv_counts) const;
  void alltoallv(std::span<const double> send, std::span<const int> send_counts, std::span<double> recv,
                 std::span<const int> recv_counts) const;

 private:
  template <class T>
  void a2av(std::span<const T> send, std::span<const int> sc, std::span<T> recv, std::span<const int> rc,
            MPI_Datatype t) const;
  template <class T>
  void gatherv(std::span<const T> mine, std::span<T> all, std::span<const int> counts, MPI_Datatype t) const;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1, size_ = 0;
};

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
  // rank), this rank's slice (slice_of) into `mine`. allgather: every rank's slice of `full`, its
  // own already in place, to every rank. Both in rounds of at most a bucket (each rank's share of
  // it), so no count or displacement passes int and messages stay bounded as for the all-reduce.
  void reduce_scatter_sum(const float* full, size_t n, float* mine);
  void allgather(float* full, size_t n);
  // The sum over ranks of full[range] (full: n values on every rank) to the owners of its parts
  // (owner_pieces; one MPI_Reduce per piece), in place: this rank's part of range then holds the
  // sum, the rest of range is left as it was.
  void reduce_to_owners(float* full, size_t n, Slice range);

 private:
  const Comm& comm_;
  size_t bucket_;
  std::vector<float> pack_;  // one round's values, every rank's piece in rank order
};

}  // namespace sb
