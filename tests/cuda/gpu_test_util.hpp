// Shared by the GPU tests that run whole models: skip (printing why) where no GPU is usable.
#pragma once
#include <cstdio>
#include <string>

#include "kernels/cuda/attention_cuda.hpp"

namespace sbtest {

inline bool have_gpu() {
  std::string why;
  if (sb::kernels::cuda::device_available(&why)) return true;
  std::printf("no usable GPU (%s): skipped\n", why.c_str());
  return false;
}

}  // namespace sbtest
