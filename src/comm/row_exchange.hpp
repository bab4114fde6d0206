// The rows of one split document moving within its group (context parallelism, src/parts/groups.hpp):
// who sends which rows where, as plain lists of runs, and one executor over any point-to-point
// transport. The same plans run on MPI with host buffers (MpiRowTransport, here: the CPU tests and
// the GPU's host-staged path) and on NCCL with device buffers (nccl_group_cuda.hpp), so the index
// logic is tested on the CPU with real ranks. Buffers are opaque rows of row_bytes each.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace sb {

class Group;

// One member's token ranges [begin, end) of the document, ascending, packed back to back on it.
using RowRanges = std::vector<std::pair<int32_t, int32_t>>;

// A run of `rows` rows from row `src` of the sending buffer to row `dst` of the receiving one,
// between this member and `peer` (a local copy: peer is this member).
struct RowMove {
  int peer;
  size_t src, dst, rows;
};

// One member's part of one exchange. Its sends to a peer and that peer's receives from it list the
// same runs in the same order: the transports match them by order.
struct RowPlan {
  std::vector<RowMove> send, recv, local;
  size_t in_rows = 0, out_rows = 0;  // rows of the source and destination buffers
  int members = 0;
};

// The all-gather: member me's packed rows (in_rows = its tokens) -> the whole document's rows
// (out_rows = doc_len), in document order, on every member. The members' pieces must tile
// [0, doc_len) (else sb::Error).
RowPlan gather_plan(const std::vector<RowRanges>& pieces, int me, int32_t doc_len);
// The moves of the reduce-scatter: every member's whole-document rows (in_rows = doc_len) -> member
// me's stage of G blocks of its packed rows (out_rows = G x its tokens; block m holds member m's rows
// for me, its own block included). The caller sums the blocks in member order (sum_blocks_bf16 or a
// device kernel), so the sum is one fixed order on every path.
RowPlan scatter_plan(const std::vector<RowRanges>& pieces, int me, int32_t doc_len);

// A point-to-point transport. Everything posted between begin() and end() may run concurrently;
// MPI completes it at end(), NCCL enqueues it on a stream (complete when the stream gets there).
class RowTransport {
 public:
  virtual ~RowTransport() = default;
  virtual void begin() = 0;
  virtual void send(const void* p, size_t bytes, int peer) = 0;
  virtual void recv(void* p, size_t bytes, int peer) = 0;
  virtual void copy(void* to, const void* from, size_t bytes) = 0;
  virtual void end() = 0;
};

// Runs plan: `from` (in_rows x row_bytes) -> `to` (out_rows x row_bytes). Returns the bytes received.
size_t run_plan(const RowPlan& plan, RowTransport& t, const void* from, void* to, size_t row_bytes);

// MPI on host buffers, within a Group: MPI_Isend / MPI_Irecv, waited for at end().
class MpiRowTransport final : public RowTransport {
 public:
  explicit MpiRowTransport(const Group& g);
  void begin() override { reqs_.clear(); }
  void send(const void* p, size_t bytes, int peer) override;
  void recv(void* p, size_t bytes, int peer) override;
  void copy(void* to, const void* from, size_t bytes) override;
  void end() override;

 private:
  MPI_Comm comm_;
  std::vector<MPI_Request> reqs_;
};

// The reduce-scatter's sum on bf16 bits (the device's rows on the host; conversions in base/bf16.hpp):
// out[i] = bf16(sum over m in member order of float(stage[m * n + i])).
void sum_blocks_bf16(const uint16_t* stage, int members, size_t n, uint16_t* out);

}  // namespace sb
