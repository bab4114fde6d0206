// Kernel parameters shared by the two generations of attention kernels (mma.sync: attention_fwd.cu,
// attention_bwd.cu; wgmma on sm_90a: attention_*_sm90.cu), and the sm_90a launchers.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
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
  // Column split (wgmma backward only): a column of more than `chunk` 64-query tiles is cut into
  // chunks of `chunk` tiles, one CTA each (n_split CTAs per item, the spare ones exit at once); their
  // dK, dV (dK already scaled) are added into dkv_acc (fp32, (N, Hkv, D) dK then dV, zeroed) and
  // converted afterwards. chunk 0: one CTA per column, as the mma.sync kernel always does.
  float* dkv_acc = nullptr;
  int chunk = 0, n_split = 1;
  // head_split W > 0 (attention_bwd.cu column_split, wherever a column is split; n_split = the
  // group's query heads x the chunks of the longest head): a split column is cut at its query heads (GQA), then
  // each head's tiles into chunks, and the launch runs in windows of W items (the SMs), piece-major
  // within a window, so that CTAs running together read one stretch of one head's Q, dO and dQ (L2
  // reuse) while the heavy items of the launch order still start first
  int head_split = 0;
  int n_items = 0;  // work items (key blocks x kv heads): the grid's CTAs before the column split
  // The compacted grid (attention_bwd.cu, compact_pieces; set_bwd_compact): the positions in the
  // full grid (n_items x n_split, the order above) of the pieces that have tiles, *work_count of
  // them; CTA x < *work_count takes work[x], the CTAs past the count (the grid is a host bound)
  // leave at once. nullptr: the full grid, whose spare pieces leave once they have read their column.
  const int32_t* work = nullptr;
  const int* work_count = nullptr;
  int64_t n_tokens = 0;  // rows of k, v (dkv_acc's dV half starts at n_tokens x Hkv x D)
  const float* lse2 = nullptr;  // wgmma backward: lse * log2(e) (bwd_prep_kernel), read instead of lse
  // wgmma backward, set_bwd_trace: 16 values a CTA (blockIdx.x < trace_ctas; attention_cuda.hpp)
  unsigned long long* trace = nullptr;
  int64_t trace_ctas = 0;
  // wgmma backward: an unsplit whole key block's dK, dV leave through shared memory by TMA stores;
  // the launcher sets it where dk, dv are 16-byte aligned (else each thread stores its own rows)
  bool tma_dkv = false;
};

// The tiled dQ workspace (the wgmma backward's default): (H, D / 64, N, 64) fp32, so that
// the 64-column panel of any run of consecutive query rows of one head is contiguous (one bulk
// reduce-add a staged tile); within a row the 16-byte chunks are XORed with t & 7, the staging
// tile's bank swizzle. dq_tiled_row: the row's start; dq_tiled_index: element (t, h, d).
__host__ __device__ __forceinline__ int64_t dq_tiled_row(int64_t t, int h, int panel, int64_t n_tokens, int D) {
  return ((int64_t(h) * (D / 64) + panel) * n_tokens + t) * 64;
}
__host__ __device__ __forceinline__ int64_t dq_tiled_index(int64_t t, int h, int d, int64_t n_tokens, int D) {
  return dq_tiled_row(t, h, d / 64, n_tokens, D) + ((((d & 63) >> 2) ^ int(t & 7)) << 2) + (d & 3);
}

// The grid is one-dimensional over work items (block, head), launched in the order that
// DeviceSelection::upload chose (kernels/cta_order.hpp: heaviest blocks early enough, heads kept
// together for L2 reuse).
__device__ __forceinline__ void cta_item(const int32_t* items, int n_heads, int& block, int& head, int cta) {
  const int x = items[cta];
  block = x / n_heads;
  head = x % n_heads;
}

// A CTA's work item: block b, head `head` (of n_heads), its kv head g = head / group, and the
// entries [lo, lo + n) of the block's sparse row (forward: CSR row_ptr, key blocks of query block
// b) or column (backward: CSC col_ptr, query blocks that see key block b) for kv head g.
struct WorkItem {
  BlockInfo b;
  int head, g, n;
  int64_t lo;
};
__device__ __forceinline__ WorkItem work_item(const int32_t* items, int n_heads, int group, const BlockInfo* blocks,
                                              const int64_t* row_base, const int64_t* ptr, int cta) {
  WorkItem w;
  int bi;
  cta_item(items, n_heads, bi, w.head, cta);
  w.b = blocks[bi];
  w.g = w.head / group;
  const int64_t x = row_base[w.b.doc] + int64_t(w.g) * w.b.nb + w.b.i;
  w.lo = ptr[x];
  w.n = int(ptr[x + 1] - w.lo);
  return w;
}
// forward: one query head per CTA; backward: one kv head (its G query heads in turn)
__device__ __forceinline__ WorkItem fwd_item(const FwdParams& p) {
  return work_item(p.items, p.H, p.H / p.Hkv, p.blocks, p.row_base, p.row_ptr, blockIdx.x);
}
// backward: the item of the launch order and the piece s < n_split that position x of the full grid
// takes: item-major (n_split = 1 without the column split), or piece-major in windows of head_split
// items
struct BwdCta {
  int item, s;
};
__host__ __device__ __forceinline__ BwdCta bwd_cta(const BwdParams& p, int x) {
  if (!p.head_split) return {x / p.n_split, x % p.n_split};
  const int W = p.head_split, grp = x / (W * p.n_split);
  const int r = x - grp * W * p.n_split, n_win = min(W, p.n_items - grp * W);  // items in this window
  return {grp * W + r % n_win, r / n_win};
}
__device__ __forceinline__ WorkItem bwd_item(const BwdParams& p, int item) {
  return work_item(p.items, p.Hkv, 1, p.blocks, p.row_base, p.col_ptr, item);
}
// Whether a column of nq query blocks is split over several CTAs (its dK, dV added in fp32 and
// converted by dkv_convert_kernel): more than p.chunk 64-query tiles, two a query block a head.
__host__ __device__ __forceinline__ bool bwd_column_split(const BwdParams& p, int G, int nq) {
  return p.chunk > 0 && G * nq * 2 > p.chunk;
}
// The tiles [it0, it0 + niter) of its column (G query heads x nq query blocks x kSub tiles of QT
// queries) that piece s takes; false: none (a spare piece). The column split takes
// chunk s of the column's tiles (the last chunk any remainder, so a low bound on the host loses
// nothing); the head split instead head s / m of the group, chunk s % m of that head's nq * kSub
// tiles (m = n_split / G; the head's last chunk any remainder). On the host too, for
// tests/cuda/test_bwd_pieces.cu.
__host__ __device__ __forceinline__ bool bwd_piece(const BwdParams& p, int G, int nq, int QT, int s, int& it0, int& niter) {
  const int kSub = 128 / QT, total = G * nq * kSub;
  const bool split = bwd_column_split(p, G, nq);
  const int chunk = (p.chunk + QT / 64 - 1) / (QT / 64);  // in QT-query tiles
  it0 = 0;
  niter = total;
  if (split && p.head_split) {
    const int m = p.n_split / G, nt = nq * kSub, c0 = (s % m) * chunk;
    if (c0 >= nt) return false;
    it0 = (s / m) * nt + c0;
    niter = s % m == m - 1 ? nt - c0 : min(chunk, nt - c0);
  } else if (split) {
    if (s * chunk >= total) return false;
    it0 = s * chunk;
    niter = s == p.n_split - 1 ? total - it0 : min(chunk, total - it0);
  } else if (s > 0) {
    return false;
  }
  return true;
}

// Forward epilogue, shared by the two generations: finish the row sums l across the 4 lanes of a
// row, scale O by 1/l, store it (bf16) and the row's log-sum-exp (natural log; m is in log2 units).
// Each thread holds rows rloc and rloc + 8 (rloc: the warp's first row + lane / 4) and, per n8
// column chunk n, columns 2 (lane & 3) + {0, 1}. The accumulator fragment layouts differ (mma.sync:
// o[n][4], wgmma: o[4n]), so the caller passes frag(n, e) -> element e of chunk n; it is inlined
// to the same register accesses as before.
template <int D, class Frag>
__device__ __forceinline__ void fwd_store(const FwdParams& p, const BlockInfo& b, int h, int rloc, int lane,
                                          float (&l)[2], const float (&m)[2], Frag frag) {
  constexpr int DN = D / 8;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int rr = rloc + r * 8;
    if (rr >= b.len) continue;
    const int64_t t = b.t0 + rr;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    bf16* orow = p.out + (t * p.H + h) * D + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < DN; n++)
      *reinterpret_cast<__nv_bfloat162*>(orow + n * 8) =
          __floats2bfloat162_rn(frag(n, 2 * r) * inv, frag(n, 2 * r + 1) * inv);
    if ((lane & 3) == 0)
      p.lse[t * p.H + h] = l[r] > 0.f ? (m[r] + __log2f(l[r])) * 0.69314718055994531f : INFINITY;
  }
}

// Which kernels run: the wgmma ones (sm_90a build, a compute-capability 9.0 device, block 128) unless
// prefer_wgmma_attention(false) asks for the mma.sync ones (tests and the benchmark; the portable path).
bool use_sm90(int block_size);

// TMA descriptors of the wgmma kernels (kernels/cuda/tma.hpp), made by their launchers per call.
struct FwdMaps {
  CUtensorMap q, k, v;  // 128-row boxes
};
struct BwdMaps {
  CUtensorMap q, dout;    // 64-row boxes
  CUtensorMap k, v;       // 128-row boxes
  CUtensorMap dk, dv;     // 128-row boxes (BwdParams::tma_dkv; otherwise unused copies of k, v)
};

// wgmma kernels for block size 128, head_dim 64 or 128 (the launchers throw on other shapes);
// n_tokens: rows of q, k, v (the tensor maps' extent).
void launch_fwd_sm90(const FwdParams& p, int head_dim, int n_blocks, int64_t n_tokens, cudaStream_t stream);
// The compacted grid's inputs (bwd_pieces.cu): off (the full grid, n_items x n_split), or the
// selection's kept blocks (or a bound on them) and its scratch.
struct BwdCompact {
  bool on = false;
  int64_t kept = -1;
  void* scratch = nullptr;
  size_t bytes = 0;
};
// Expects dq_acc zeroed and delta, lse2 computed (bwd_prep_kernel); dQ goes into the tiled
// workspace (dq_tiled_index).
void launch_bwd_sm90(const BwdParams& p, int head_dim, int64_t n_tokens, const BwdCompact& compact,
                     cudaStream_t stream);

// The compacted grid (bwd_pieces.cu). compact_pieces lists, on `stream`, the positions of p's pieces
// that have tiles into scratch (compact_scratch_bytes of the full grid's n_items x n_split
// positions), sets p.work and p.work_count, and returns the grid to launch (piece_bound: at most the
// full grid); where scratch is too small, nothing is split, or the items' column lengths would not
// fit its one CTA's shared memory (over 11,264 items), it returns the full grid and leaves p.work unset. qt: the kernel's query tile; kept: the selection's kept blocks, or a bound on them.
size_t compact_scratch_bytes(int64_t positions);
int64_t piece_bound(const BwdParams& p, int qt, int64_t kept);
int64_t compact_pieces(BwdParams& p, int qt, int64_t kept, void* scratch, size_t scratch_bytes, cudaStream_t stream);
// The scratch the backward's compacted grid needs for a selection of this size (attention_bwd.cu:
// the column split the backward would choose now; kept as block_attention_bwd passes it, -1 when
// unknown on the host); 0 where it runs no column split.
size_t bwd_work_bytes(int n_blocks, int max_doc_blocks, int64_t kept, AttnShape s);

}  // namespace sb::kernels::cuda
