// NCCL for a split document's group (context parallelism, one GPU per rank): the RowTransport of
// row_exchange.hpp on device buffers. A plan's runs are grouped ncclSend / ncclRecv inside one
// ncclGroupStart/End (members hold unequal row counts, which ncclAllGather / ncclReduceScatter do
// not take), enqueued on the caller's stream: no host sync.
//
// Point-to-point needs no communicator per group: one communicator over the world, a group's member
// m addressed as world rank first + m. The groups change every step with the plan, and a
// communicator per group (ncclCommSplit or ncclCommInitRank) would cost an initialisation of
// 0.1-1 s and NCCL's buffers for each new one; ranks outside a group take no part in its sends.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "src/comm/row_exchange.hpp"

namespace sb {

class Comm;

class NcclGroupTransport final : public RowTransport {
 public:
  // Collective over the world (every rank, after choosing its device): ncclCommInitRank with a
  // unique id broadcast over MPI. NCCL needs one GPU per rank.
  explicit NcclGroupTransport(const Comm& world);
  ~NcclGroupTransport() override;
  NcclGroupTransport(const NcclGroupTransport&) = delete;
  NcclGroupTransport& operator=(const NcclGroupTransport&) = delete;
  // The group of world ranks [first, first + G) the next plans run in (peers are members), and the
  // stream begin()..end() enqueue on.
  void bind(int first, cudaStream_t s) { first_ = first, stream_ = s; }
  void begin() override;
  void send(const void* p, size_t bytes, int peer) override;
  void recv(void* p, size_t bytes, int peer) override;
  void copy(void* to, const void* from, size_t bytes) override;  // device to device, on the stream
  void end() override;

 private:
  ncclComm_t comm_ = nullptr;
  int first_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace sb
