// Checked CUDA runtime calls, for every library that calls CUDA (kernels/cuda, src/model,
// src/train, src/comm): every call and every launch goes through SB_CUDA_CHECK /
// SB_CUDA_CHECK_LAUNCH, which throw sb::Error naming the call, the file and line, and the error.
// Header only: it needs the CUDA runtime headers, which only CUDA-linked code has; sb_base itself
// links nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "base/error.hpp"

namespace sb {
inline std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}
}  // namespace sb

#define SB_CUDA_CHECK(call) \
  SB_CHECK_CALL("CUDA", call, sb_cuda_err_, sb_cuda_err_ == cudaSuccess, ::sb::cuda_error_text(sb_cuda_err_))

// After a <<<>>> launch: configuration errors now (execution errors surface at the next checked sync).
#define SB_CUDA_CHECK_LAUNCH(kernel_name)                                                            \
  do {                                                                                               \
    cudaError_t sb_cuda_err_ = cudaGetLastError();                                                   \
    if (sb_cuda_err_ != cudaSuccess)                                                                 \
      ::sb::fail_call("CUDA", "launch of " kernel_name, __FILE__, __LINE__, ::sb::cuda_error_text(sb_cuda_err_)); \
  } while (0)
