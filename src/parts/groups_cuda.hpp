// The device exchange of split documents' rows (PartExchangeCuda, src/model/model_cuda.hpp)
// over the groups of a PartGroups (part.hpp): the plans of src/comm/row_exchange.hpp run on NCCL
// point-to-point with device buffers (one GPU per rank), or on MPI through host memory when ranks
// share a GPU (NCCL cannot put two ranks of one communicator on one device). The engine picks by
// the rule it uses for gradients (engine_cuda.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "src/comm/nccl_group_cuda.hpp"
#include "src/model/model_cuda.hpp"
#include "src/parts/groups.hpp"

namespace sb {

class PartExchangeDevice {
 public:
  using bf16 = kernels::cuda::bf16;
  // With nccl, collective over the world (every rank, after choosing its device): one NCCL
  // communicator whose point-to-point every group uses. groups: the trainer's, set before a batch
  // with parts runs (set_groups).
  PartExchangeDevice(const Comm& world, bool nccl);
  PartExchangeDevice(const PartExchangeDevice&) = delete;
  PartExchangeDevice& operator=(const PartExchangeDevice&) = delete;
  void set_groups(const PartGroups* g) { groups_ = g; }
  const PartExchangeCuda& exchange() const { return ex_; }
  bool nccl() const { return nccl_ != nullptr; }
  // For the start line of training.
  const char* describe() const;

 private:
  void gather(const DocPart& sh, const bf16* mine, bf16* whole, int width, cudaStream_t s);
  void reduce_scatter(const DocPart& sh, const bf16* whole, bf16* mine, int width, cudaStream_t s);
  const PartGroups::View view(const DocPart& sh) const;

  const PartGroups* groups_ = nullptr;
  std::unique_ptr<NcclGroupTransport> nccl_;
  PartExchangeCuda ex_;
  DeviceArray<bf16> stage_;                     // NCCL: reduce_scatter's G blocks of this rank's rows
  std::vector<uint16_t> h_in_, h_out_, h_sum_;  // host-staged: the rows in bf16 bits
};

}  // namespace sb
