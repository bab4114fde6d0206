// LoRA dropout on the GPU (lora_dropout.cu): the mask of kernels/lora_dropout.hpp, the same elements
// the CPU drops, on the adapter's input and its gradient. Device pointers, asynchronous on `stream`.
// Plain C++ header.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace sb::kernels::cuda {

// xd (n) = keep(key, i) ? bf16(x * inv) : 0, element i of x (n) bf16.
void lora_dropout_fwd(const __nv_bfloat16* x, __nv_bfloat16* xd, size_t n, uint64_t key, uint32_t threshold, float inv,
                      cudaStream_t stream = nullptr);
// dx (n) += keep(key, i) ? g * inv : 0 (the gradient through the mask), g fp32; dx fp32 or bf16.
void lora_dropout_bwd_add(const float* g, float* dx, size_t n, uint64_t key, uint32_t threshold, float inv,
                          cudaStream_t stream = nullptr);
void lora_dropout_bwd_add(const float* g, __nv_bfloat16* dx, size_t n, uint64_t key, uint32_t threshold, float inv,
                          cudaStream_t stream = nullptr);

}  // namespace sb::kernels::cuda
