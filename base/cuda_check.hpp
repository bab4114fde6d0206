// Checked CUDA runtime calls, for every library that calls CUDA (kernels/cuda, src/model,
// src/train, src/comm): every call and every launch goes through SB_CUDA_CHECK /
// SB_CUDA_CHECK_LAUNCH, which throw sb::Error naming the call, the file and line, and the error.
// Header only: it needs the CUDA runtime headers, which only CUDA-linked code has; sb_base itself
// links nothing.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "base/error.hpp"

namespace sb {
// An allocation that failed also says how much the device had free, and what lowers a rank's use.
inline std::string cuda_error_text(cudaError_t e) {
  std::string s = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  if (e != cudaErrorMemoryAllocation) return s;
  int dev = -1;
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&dev) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    char buf[128];
    std::snprintf(buf, sizeof buf, " (device %d: %.2f of %.2f GiB free)", dev, double(free_b) / (1 << 30),
                  double(total_b) / (1 << 30));
    s += buf;
  }
  (void)cudaGetLastError();  // a failed query above must not linger as the next call's error
  return s + "; less GPU memory a rank: train.recompute = \"layer\", a smaller train.micro_batch_tokens, or "
             "train.zero = 1 over several ranks (src/model/README.md)";
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
