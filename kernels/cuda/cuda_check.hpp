// Checked cuBLAS calls: SB_CUBLAS_CHECK throws sb::Error naming the call, the file and line, and
// the cublasStatus_t name. The CUDA runtime checks (SB_CUDA_CHECK, SB_CUDA_CHECK_LAUNCH) are in
// base/cuda_check.hpp, included here for the kernels' convenience.
#pragma once
#include <cublas_v2.h>

#include "base/cuda_check.hpp"
#include "base/error.hpp"

#define SB_CUBLAS_CHECK(call) \
  SB_CHECK_CALL("cuBLAS", call, sb_cublas_st_, sb_cublas_st_ == CUBLAS_STATUS_SUCCESS, cublasGetStatusName(sb_cublas_st_))
