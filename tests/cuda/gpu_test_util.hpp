// Shared by the GPU tests that run whole models: skip (printing why) where no GPU is usable, and
// the same training run on the CPU engine then the CUDA one, compared step by step.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "src/model/gpu_buffers.hpp"
#include "src/train/trainer.hpp"
#include "tests/train/train_test_util.hpp"

namespace sbtest {

inline bool have_gpu() {
  std::string why;
  if (sb::kernels::cuda::device_available(&why)) return true;
  std::printf("no usable GPU (%s): skipped\n", why.c_str());
  return false;
}

// Whether ModelCuda of `base` with `lora` keeps q, k, v adjacent (gpu_buffers.hpp; its constructor checks it).
inline bool qkv_adjacent_of(const sb::ParamLayout& base, const sb::ModelDims& d, const sb::LoraSpec& lora) {
  const sb::LoraLayout ll = sb::lora_layout(base, d, lora);
  return sb::gpu_qkv_adjacent(base, ll.train, ll.of_base, sb::gpu_frozen_copies(base, ll.of_base));
}

// The losses of `flags` trained with train.device = cpu ([0]) and cuda ([1]), each with its own
// checkpoint dir and metrics log under `dir` (named by `tag`).
inline void cpu_and_gpu_losses(const sb::Comm& comm, const std::string& dir, const std::string& flags,
                               const std::string& tag, std::vector<double> (&loss)[2]) {
  for (int gpu = 0; gpu < 2; ++gpu) {
    const std::string t = tag + std::to_string(gpu);
    sb::Config cfg = tiny_config(dir, flags + " --set train.device=" + (gpu ? "cuda" : "cpu") + " --set checkpoint.dir=" +
                                          dir + "/ckpt_" + t + " --set log.path=" + dir + "/metrics_" + t + ".h5");
    sb::Trainer tr(cfg, comm, "", 0);
    loss[gpu] = tr.run().losses;  // sync_check_every = 1: throws if ranks ever hold different weights
  }
}

// Each of `steps` GPU losses within `tol` (relative) of the CPU's; *worst gets the largest difference.
inline void expect_losses_close(const std::vector<double> (&loss)[2], size_t steps, double tol, const std::string& what,
                                double* worst) {
  *worst = 0;
  ASSERT_EQ(loss[0].size(), steps);
  ASSERT_EQ(loss[1].size(), steps);
  for (size_t s = 0; s < steps; ++s) {
    const double e = std::abs(loss[1][s] - loss[0][s]) / loss[0][s];
    *worst = std::max(*worst, e);
    EXPECT_LT(e, tol) << what << "step " << s + 1 << ": gpu " << loss[1][s] << " cpu " << loss[0][s];
  }
}

}  // namespace sbtest
