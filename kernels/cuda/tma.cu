// Tensor maps for the Hopper TMA loads of the wgmma attention kernels (attention_*_sm90.cu).
#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/tma.hpp"

namespace sb::kernels::cuda {

namespace {
// The driver's encoder, through the runtime (no -lcuda at link time).
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    SB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !f)
      throw Error("tma: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}
}  // namespace

CUtensorMap tile_map(const void* base, int64_t rows, int heads, int head_dim, int box_rows) {
  if (head_dim % 64 != 0 || box_rows < 1 || box_rows > 256 || rows < 1 || heads < 1)
    throw Error("tma::tile_map: head_dim must be a multiple of 64, box rows 1..256, rows and heads >= 1");
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) throw Error("tma::tile_map: base not 16-byte aligned");
  CUtensorMap m;
  const cuuint64_t dim[3] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(rows)};
  const cuuint64_t stride[2] = {cuuint64_t(head_dim) * 2, cuuint64_t(heads) * head_dim * 2};  // bytes
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUresult r = encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dim, stride, box,
                               estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail_call("CUDA driver", "cuTensorMapEncodeTiled", __FILE__, __LINE__,
              "CUresult " + std::to_string(int(r)) + " for rows " + std::to_string(rows) + ", heads " +
                  std::to_string(heads) + ", head_dim " + std::to_string(head_dim) + ", box rows " +
                  std::to_string(box_rows));
  return m;
}

}  // namespace sb::kernels::cuda
