#include "src/comm/nccl_group_cuda.hpp"

#include "base/cuda_check.hpp"
#include "base/error.hpp"
#include "src/comm/comm.hpp"

#define SB_NCCL_CHECK(call) \
  SB_CHECK_CALL("NCCL", call, sb_nccl_r_, sb_nccl_r_ == ncclSuccess, ncclGetErrorString(sb_nccl_r_))

namespace sb {

NcclGroupTransport::NcclGroupTransport(const Comm& world) {
  ncclUniqueId id;
  if (world.root()) SB_NCCL_CHECK(ncclGetUniqueId(&id));
  world.broadcast(std::span<unsigned char>(reinterpret_cast<unsigned char*>(&id), sizeof(id)));
  SB_NCCL_CHECK(ncclCommInitRank(&comm_, world.size(), id, world.rank()));
}

NcclGroupTransport::~NcclGroupTransport() {
  if (comm_) ncclCommDestroy(comm_);
}

void NcclGroupTransport::begin() { SB_NCCL_CHECK(ncclGroupStart()); }

void NcclGroupTransport::send(const void* p, size_t bytes, int peer) {
  SB_NCCL_CHECK(ncclSend(p, bytes, ncclUint8, first_ + peer, comm_, stream_));
}

void NcclGroupTransport::recv(void* p, size_t bytes, int peer) {
  SB_NCCL_CHECK(ncclRecv(p, bytes, ncclUint8, first_ + peer, comm_, stream_));
}

void NcclGroupTransport::copy(void* to, const void* from, size_t bytes) {
  if (bytes > 0) SB_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void NcclGroupTransport::end() { SB_NCCL_CHECK(ncclGroupEnd()); }

}  // namespace sb
