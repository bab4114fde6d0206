// Kernel parameters shared by the two generations of attention kernels (mma.sync: attention_fwd.cu,
// attention_bwd.cu; wgmma on sm_90a: attention_*_sm90.cu), and the sm_90a launchers.
#pragma once
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention_cuda.hpp"

namespace sb::kernels::cuda {

struct FwdParams {
  const bf16 *q, *k, *v;
  bf16* out;
  float* lse;
  const BlockInfo* blocks;
  const int64_t *row_base, *row_ptr;
  const int32_t* cols;
  int H, Hkv;
  float scale_log2;  // log2(e) / sqrt(D)
  const int32_t* items;  // (n_blocks x H) CTA -> block * H + head (DeviceSelection::fwd_items)
};

struct BwdParams {
  const bf16 *q, *k, *v, *dout;
  const float *lse, *delta;
  float* dq_acc;
  bf16 *dk, *dv;
  const BlockInfo* blocks;
  const int64_t *row_base, *col_ptr;
  const int32_t* col_rows;
  int H, Hkv;
  float scale, scale_log2;
  const int32_t* items;  // (n_blocks x Hkv) CTA -> block * Hkv + kv head (DeviceSelection::bwd_items)
  int variant;  // dQ accumulation (attention_bwd.cu, bwd_variant): 0 the kernel's default, 1 float2
                // atomics from registers, 4 shared tile + bulk reduce-add (mma.sync only)
};

// The grid is one-dimensional over work items (block, head), launched in the order that
// DeviceSelection::upload chose (kernels/cta_order.hpp: heaviest blocks early enough, heads kept
// together for L2 reuse).
__device__ __forceinline__ void cta_item(const int32_t* items, int n_heads, int& block, int& head) {
  const int x = items[blockIdx.x];
  block = x / n_heads;
  head = x % n_heads;
}

// Which kernels run: the wgmma ones (sm_90a build, a compute-capability 9.0 device, block 128) unless
// SB_ATTN_KERNEL=mma asks for the mma.sync ones (kept as the portable path and for comparison).
bool use_sm90(int block_size);

// TMA descriptors of the wgmma kernels (kernels/cuda/tma.hpp), made by their launchers per call.
struct FwdMaps {
  CUtensorMap q, k, v;  // 128-row boxes
};
struct BwdMaps {
  CUtensorMap q, dout;  // 64-row boxes
  CUtensorMap k, v;     // 128-row boxes
};

// wgmma kernels for block size 128, head_dim 64 or 128 (the launchers throw on other shapes);
// n_tokens: rows of q, k, v (the tensor maps' extent).
void launch_fwd_sm90(const FwdParams& p, int head_dim, int n_blocks, int64_t n_tokens, cudaStream_t stream);
// Expects dq_acc zeroed and delta computed (bwd_prep_kernel), as the mma.sync kernel does.
void launch_bwd_sm90(const BwdParams& p, int head_dim, int n_blocks, int64_t n_tokens, cudaStream_t stream);

}  // namespace sb::kernels::cuda
