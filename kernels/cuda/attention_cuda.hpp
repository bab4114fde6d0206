// CUDA block-sparse attention (bf16 in/out, fp32 accumulation, FlashAttention-2 style: online
// softmax, no L x L matrix), driven by the same CSR BlockSelection as the CPU kernels.
// Causal inside each document, varlen (cu_seqlens), GQA; head_dim 64 or 128; block size 64 or 128.
// Layouts as kernels.hpp: q,out,dq (N,H,D); k,v,dk,dv (N,Hkv,D); lse (N,H) natural-log,
// +inf on rows that keep no block (their out is 0). Plain C++ header (no CUDA syntax).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cta_order.hpp"
#include "kernels/kernels.hpp"

namespace sb::kernels::cuda {

using bf16 = __nv_bfloat16;

// One block of one document (query block in the forward, key block in the backward).
struct BlockInfo {
  int32_t doc, i, t0, len;  // document, block index in it, first token (global), tokens in block
  int32_t nb, doc_t0, doc_len, pad;
};

// A BlockSelection on the device, plus its transpose (for each (doc, kv head, key block j) the
// query blocks i that keep j, ascending) for the backward pass. Owns its device memory.
class DeviceSelection {
 public:
  DeviceSelection() = default;
  DeviceSelection(const DeviceSelection&) = delete;
  DeviceSelection& operator=(const DeviceSelection&) = delete;
  ~DeviceSelection();
  // Copies sel (built for cu_seqlens / shape s) to the device; synchronous on `stream`. Reuses the
  // buffers of the previous upload when they are large enough.
  void upload(const BlockSelection& sel, const int32_t* cu_seqlens_host, int ndocs, AttnShape s,
              cudaStream_t stream = nullptr);
  void release();  // frees the buffers
  // Sizes the buffers for a selection built on the device (DeviceGating::select): n_blocks blocks of
  // ndocs documents, rows = n_blocks x Hkv, at most max_kept kept blocks; grows only. kept is then
  // unknown on the host (-1).
  void reserve(int n_blocks, int ndocs, int64_t max_kept, AttnShape s, int64_t n_tokens, int max_doc_blocks);
  // Host copy of everything above (tests; synchronises `stream`): the CSR as a BlockSelection (no
  // recall), the transpose and both launch orders.
  struct HostCopy {
    std::vector<BlockInfo> blocks;
    BlockSelection sel;
    std::vector<int64_t> col_ptr;
    std::vector<int32_t> col_rows, fwd_items, bwd_items;
  };
  HostCopy download(int ndocs, cudaStream_t stream = nullptr) const;

  int n_blocks = 0;                  // (doc, block) pairs
  int block_size = 0, n_heads = 0, n_kv_heads = 0;
  int64_t n_tokens = 0, kept = 0;    // tokens covered; kept blocks over all rows
  int max_doc_blocks = 0;            // blocks of the longest document: the bound of any column's length
  BlockInfo* blocks = nullptr;       // (n_blocks), documents in order
  int32_t* fwd_items = nullptr;      // (n_blocks x n_heads) CTA launch order, block * n_heads + head
  int32_t* bwd_items = nullptr;      // (n_blocks x n_kv_heads) same for the backward (kernels/cta_order.hpp)
  int64_t* row_base = nullptr;       // (ndocs + 1)
  int64_t* row_ptr = nullptr;        // (rows + 1)
  int32_t* cols = nullptr;           // (kept)
  int64_t* col_ptr = nullptr;        // (rows + 1), transpose
  int32_t* col_rows = nullptr;       // (kept), transpose: query block indices
  int64_t max_kept = 0;              // kept (upload), or the bound reserve() sized the buffers for
  // Scratch of the wgmma backward's compacted grid (its pieces with tiles, listed on the device;
  // attention_bwd.cu), sized by upload() and reserve() for the column split chosen then; where it
  // is too small (none: no split) the backward launches the full grid.
  void* bwd_work = nullptr;
  size_t bwd_work_size = 0;          // bytes

 private:
  std::array<size_t, 8> cap_{};      // allocated elements of the eight arrays above
};

// Two generations of attention kernels: wgmma (Hopper warpgroup MMA, attention_*_sm90.cu) where the
// build has sm_90a code, the device is compute capability 9.0 and the block size is 128; mma.sync
// (Ampere-style, every shape and architecture) otherwise. wgmma is preferred unless
// prefer_wgmma_attention(false) is called (tests and bench_attention_cuda --kernels run both).
bool wgmma_attention_available();  // built for sm_90a and running on a compute-capability 9.0 device
void prefer_wgmma_attention(bool on);
// The block size to run dense attention of shape s at. Dense keeps every causal block whatever the
// block, so it need not tile at the gating's block: 128 where the wgmma kernels take the shape (they
// tile at 128 only; the Qwen2.5-0.5B shape's dense step at block 64 ran the mma.sync kernels at 0.79x
// the tokens/s, bench/results/2026-12-02-e2e-64k-128k.md), else s.block_size.
int dense_block_size(AttnShape s);
// The wgmma backward's column split: a (key block, kv head) column of more than `tiles` 64-query
// tiles is shared by several CTAs; 0 never splits, -1 (the default) chooses from the longest document
// (attention_bwd.cu, column_split): for tests and bench_attention_cuda --bwd-chunk.
void set_bwd_column_chunk(int tiles);
// With the column split, launch only the pieces that have tiles, listed on the device (true, the
// default), or the full grid of n_split CTAs an item (false), whose pieces without tiles leave after
// reading their column: for tests and bench_attention_cuda --bwd-grid full.
void set_bwd_compact(bool on);
// The CTA launch order DeviceSelection::upload and DeviceGating plan (kernels/cta_order.hpp): mixed
// (the default); heads and blocks for bench_attention_cuda --order (each slower: bench/results/2026-11-29-tma-cta-order.md).
void set_launch_order(CtaOrder mode);
CtaOrder launch_order();
// Per-CTA timestamps of the wgmma backwards that follow (bench_attention_cuda --trace): buf (device,
// 16 x ctas values) takes, for each CTA x < ctas, at 16x: [0] %globaltimer (ns) at its start, [1]
// at its end (0: not written, a CTA without tiles, which left at once), [2] %smid, [3]
// its tiles, then %clock64 [4] at its start, [5] at its first tile, [6] after its last tile, [7]
// with the last dQ staged, [8] with the waits for the bulk adds and cp.async done, [9] at its end.
// nullptr: off (the default).
void set_bwd_trace(unsigned long long* buf, int64_t ctas);

// out, lse are fully overwritten.
void block_attention_fwd(const bf16* q, const bf16* k, const bf16* v, const DeviceSelection& sel, AttnShape s,
                         bf16* out, float* lse, cudaStream_t stream = nullptr);

// Workspace (bytes, device) the backward needs: fp32 dq accumulator and the row dot products.
size_t block_attention_bwd_workspace(int64_t n_tokens, AttnShape s);
// dq, dk, dv are fully overwritten. out, lse from block_attention_fwd.
void block_attention_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* out, const float* lse,
                         const bf16* dout, const DeviceSelection& sel, AttnShape s, bf16* dq, bf16* dk,
                         bf16* dv, void* workspace, cudaStream_t stream = nullptr);

// Gating on the GPU with the semantics of kernels::gate_blocks (kernels/cpu/gating.cpp), computed in
// double in the same order, so the kept blocks are identical and recall agrees to rounding of exp:
// pooled q (over the block's tokens and the kv head's query group) and k, s_ij = qbar_i . kbar_j /
// sqrt(D) (or the other gate modes of GatingParams, the same in every mode), anchors (sink, diagonal, w local blocks), candidates with s_ij >= a_i - theta, the best k
// (ties -> lower j), recall = sum of softmax_j s_ij over kept j. q (N,H,D), k (N,Hkv,D) on the device;
// cu_seqlens on the host; sel is filled on the host (upload it with DeviceSelection::upload).
GatingStats gate_blocks(const bf16* q, const bf16* k, const int32_t* cu_seqlens_host, int ndocs, AttnShape s,
                        GatingParams p, BlockSelection& sel, cudaStream_t stream = nullptr);

// Gating, kept-block lists (CSR, by a scan), their transpose (CSC: bit matrix, count, scan,
// scatter; query blocks ascending) and both CTA launch orders built on the device (select_device.cu),
// the same kept blocks as gate_blocks above: nothing waits on the host between layers. prepare()
// once per micro-batch (block table, per-layer budgets k into a device array, every buffer sized for
// the worst case); reserve() each layer's DeviceSelection before the layer loop; select() per layer
// (kernel launches only: no allocation, no copy to the host, no synchronisation); fetch_stats() once
// after the last layer, stats() after the stream has passed it. The default mixed launch order is
// cta_order_bounded (kernels/cta_order.hpp); set_launch_order's other orders as for upload().
class DeviceGating {
 public:
  DeviceGating();
  ~DeviceGating();
  DeviceGating(const DeviceGating&) = delete;
  DeviceGating& operator=(const DeviceGating&) = delete;
  // gate: local_blocks, theta and the gate mode (query, key, sub_blocks); its k is not read.
  void prepare(const int32_t* cu_seqlens_host, int ndocs, AttnShape s, const std::vector<int>& k_per_layer,
               GatingParams gate, cudaStream_t stream = nullptr);
  void reserve(DeviceSelection& sel) const;
  void select(const bf16* q, const bf16* k, int layer, DeviceSelection& sel, cudaStream_t stream = nullptr);
  void fetch_stats(cudaStream_t stream = nullptr);
  GatingStats stats(int layer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True recall of sampled rows (kernels::true_recall's twin, kernels/cuda/true_recall.cu): out_host[n]
// = the dense softmax mass on row rows_host[n]'s kept blocks of `sel` (row_ptr/cols on the device,
// built by upload or DeviceGating), averaged over the row's query tokens and its group's heads, fp32
// from bf16 q (N,H,D), k (N,Hkv,D). cu_seqlens on the host; synchronises `stream`.
void true_recall(const bf16* q, const bf16* k, const int32_t* cu_seqlens_host, int ndocs, AttnShape s,
                 const DeviceSelection& sel, const int64_t* rows_host, int nrows, float* out_host,
                 cudaStream_t stream = nullptr);

// SMs of the current device (the launch order's slots: one wgmma CTA per SM).
int sm_count();

// True when a CUDA device is usable (false, with the reason in *why, when not).
bool device_available(std::string* why = nullptr);

}  // namespace sb::kernels::cuda
