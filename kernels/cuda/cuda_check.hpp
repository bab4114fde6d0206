// Checked CUDA runtime calls: every call and every launch goes through SB_CUDA_CHECK /
// SB_CUDA_CHECK_LAUNCH, which throw std::runtime_error naming the file, line and call; cuBLAS calls
// through SB_CUBLAS_CHECK (same, with the cublasStatus_t name).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace sb::kernels::cuda {
[[noreturn]] inline void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
[[noreturn]] inline void cublas_fail(cublasStatus_t st, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                           cublasGetStatusName(st));
}
}  // namespace sb::kernels::cuda

#define SB_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    cudaError_t sb_cuda_err_ = (call);                                                       \
    if (sb_cuda_err_ != cudaSuccess) ::sb::kernels::cuda::cuda_fail(sb_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<>>> launch: configuration errors now (execution errors surface at the next checked sync).
#define SB_CUDA_CHECK_LAUNCH(kernel_name)                                                   \
  do {                                                                                       \
    cudaError_t sb_cuda_err_ = cudaGetLastError();                                           \
    if (sb_cuda_err_ != cudaSuccess)                                                         \
      ::sb::kernels::cuda::cuda_fail(sb_cuda_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

#define SB_CUBLAS_CHECK(call)                                                                \
  do {                                                                                       \
    cublasStatus_t sb_cublas_st_ = (call);                                                   \
    if (sb_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::sb::kernels::cuda::cublas_fail(sb_cublas_st_, #call, __FILE__, __LINE__);            \
  } while (0)
