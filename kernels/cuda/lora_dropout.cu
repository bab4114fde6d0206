// LoRA dropout's mask on the GPU (lora_dropout_cuda.hpp): kernels/lora_dropout.hpp per element.
#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/lora_dropout_cuda.hpp"
#include "kernels/lora_dropout.hpp"

namespace sb::kernels::cuda {
namespace {

constexpr int kThreads = 256;
unsigned blocks(size_t n) { return unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, 65536)); }

__global__ void __launch_bounds__(kThreads) dropout_fwd_kernel(const __nv_bfloat16* x, __nv_bfloat16* xd, size_t n,
                                                                uint64_t key, uint32_t threshold, float inv) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    xd[i] = dropout_keep(key, i, threshold) ? __float2bfloat16(__bfloat162float(x[i]) * inv) : __float2bfloat16(0.f);
}

template <class Y>
__global__ void __launch_bounds__(kThreads) dropout_bwd_add_kernel(const float* g, Y* dx, size_t n, uint64_t key,
                                                                    uint32_t threshold, float inv) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (dropout_keep(key, i, threshold)) dx[i] = Y(float(dx[i]) + g[i] * inv);
}

}  // namespace

void lora_dropout_fwd(const __nv_bfloat16* x, __nv_bfloat16* xd, size_t n, uint64_t key, uint32_t threshold, float inv,
                      cudaStream_t stream) {
  if (n == 0) return;
  dropout_fwd_kernel<<<blocks(n), kThreads, 0, stream>>>(x, xd, n, key, threshold, inv);
  SB_CUDA_CHECK_LAUNCH("dropout_fwd_kernel");
}

void lora_dropout_bwd_add(const float* g, float* dx, size_t n, uint64_t key, uint32_t threshold, float inv,
                          cudaStream_t stream) {
  if (n == 0) return;
  dropout_bwd_add_kernel<<<blocks(n), kThreads, 0, stream>>>(g, dx, n, key, threshold, inv);
  SB_CUDA_CHECK_LAUNCH("dropout_bwd_add_kernel (fp32)");
}

void lora_dropout_bwd_add(const float* g, __nv_bfloat16* dx, size_t n, uint64_t key, uint32_t threshold, float inv,
                          cudaStream_t stream) {
  if (n == 0) return;
  dropout_bwd_add_kernel<<<blocks(n), kThreads, 0, stream>>>(g, dx, n, key, threshold, inv);
  SB_CUDA_CHECK_LAUNCH("dropout_bwd_add_kernel (bf16)");
}

}  // namespace sb::kernels::cuda
