#include "src/parts/groups_cuda.hpp"

#include <cuda_bf16.h>

#include <stdexcept>

#include "base/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"

namespace sb {

namespace kc = kernels::cuda;
static_assert(sizeof(kc::bf16) == sizeof(uint16_t), "bf16 rows travel as their 16 bits");

PartExchangeDevice::PartExchangeDevice(const Comm& world, bool nccl) {
  if (nccl) nccl_ = std::make_unique<NcclGroupTransport>(world);
  ex_.gather = [this](const DocPart& sh, const bf16* mine, bf16* whole, int width, cudaStream_t s) {
    gather(sh, mine, whole, width, s);
  };
  ex_.reduce_scatter = [this](const DocPart& sh, const bf16* whole, bf16* mine, int width, cudaStream_t s) {
    reduce_scatter(sh, whole, mine, width, s);
  };
}

const char* PartExchangeDevice::describe() const {
  return nccl_ ? "NCCL point-to-point on device buffers" : "MPI through host memory (more ranks than GPUs on a node)";
}

const PartGroups::View PartExchangeDevice::view(const DocPart& sh) const {
  if (!groups_) throw std::logic_error("PartExchangeDevice: a batch with documents in parts needs their groups");
  return groups_->view(sh.group);
}

namespace {

// Device rows -> host bits, and back; each returns with the copy done (the buffers are reused).
void down(const kc::bf16* d, std::vector<uint16_t>& h, size_t n, cudaStream_t s) {
  h.resize(n);
  SB_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, s));
  SB_CUDA_CHECK(cudaStreamSynchronize(s));
}
void up(const std::vector<uint16_t>& h, kc::bf16* d, size_t n, cudaStream_t s) {
  SB_CUDA_CHECK(cudaMemcpyAsync(d, h.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice, s));
  SB_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace

void PartExchangeDevice::gather(const DocPart& sh, const bf16* mine, bf16* whole, int width, cudaStream_t s) {
  const PartGroups::View v = view(sh);
  const RowPlan p = gather_plan(v.pieces, v.comm.rank(), v.doc_len);
  const size_t rb = size_t(width) * sizeof(uint16_t);
  if (nccl_) {
    nccl_->bind(v.first, s);
    run_plan(p, *nccl_, mine, whole, rb);
    return;
  }
  down(mine, h_in_, p.in_rows * size_t(width), s);
  h_out_.resize(p.out_rows * size_t(width));
  MpiRowTransport t(v.comm);
  run_plan(p, t, h_in_.data(), h_out_.data(), rb);
  up(h_out_, whole, h_out_.size(), s);
}

// Every member's contribution to this rank's rows into G blocks (block m: member m's), then their
// sum in member order in fp32, rounded once: the same bits on the device and on the host.
void PartExchangeDevice::reduce_scatter(const DocPart& sh, const bf16* whole, bf16* mine, int width,
                                         cudaStream_t s) {
  const PartGroups::View v = view(sh);
  const RowPlan p = scatter_plan(v.pieces, v.comm.rank(), v.doc_len);
  const size_t rb = size_t(width) * sizeof(uint16_t), n = p.out_rows / size_t(p.members) * size_t(width);
  if (nccl_) {
    nccl_->bind(v.first, s);
    bf16* st = stage_.resize(p.out_rows * size_t(width));
    run_plan(p, *nccl_, whole, st, rb);
    kc::sum_blocks(st, p.members, n, mine, s);
    return;
  }
  down(whole, h_in_, p.in_rows * size_t(width), s);
  h_out_.resize(p.out_rows * size_t(width));
  MpiRowTransport t(v.comm);
  run_plan(p, t, h_in_.data(), h_out_.data(), rb);
  h_sum_.resize(n);
  sum_blocks_bf16(h_out_.data(), p.members, n, h_sum_.data());
  up(h_sum_, mine, n, s);
}

}  // namespace sb
