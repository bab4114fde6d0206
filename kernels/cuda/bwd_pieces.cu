// The wgmma backward's compacted grid (BwdParams::work). With the column split the full grid has
// n_split CTAs an item, enough for the longest possible column, and most columns are short: at
// density 0.1, 85-88% of the GQA grid's CTAs have no tiles (bench/analysis/bwd_spare_ctas.py) and leave only
// after reading their column's length, about 1 us each, interleaved with the working CTAs
// (bench/results/2026-12-04-bwd-per-cta.md). Here one CTA lists, on the device, the full-grid positions of the
// pieces that have tiles, in launch order; the grid is a bound on their count from the kept blocks,
// so nothing waits on the host, and the CTAs past the count leave at the end of the launch.
// (CUB's DeviceSelect did the same in two launches and host-side queries: 0.945x the backward's
// time of the full grid at the Qwen2.5-0.5B shape, 16K, density 0.1; bench/results/2026-12-06-compacted-grid.md.)
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"

namespace sb::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kMaxItems = 11 * 1024;  // column lengths in shared memory (44 KB: under the 48 KB without opt-in)

// The columns' lengths into shared memory, then each thread takes a contiguous run of positions:
// count its pieces with tiles (bwd_piece, the kernel's own test), one block scan, list them.
__global__ void __launch_bounds__(kThreads) compact_kernel(const BwdParams p, int qt, int* count, int32_t* work) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  extern __shared__ int nq[];  // (n_items)
  for (int i = int(threadIdx.x); i < p.n_items; i += kThreads) nq[i] = bwd_item(p, i).n;
  __syncthreads();
  const int G = p.H / p.Hkv, positions = p.n_items * p.n_split, per = (positions + kThreads - 1) / kThreads;
  const int lo = min(positions, int(threadIdx.x) * per), hi = min(positions, lo + per);
  auto has_tiles = [&](int x) {
    const BwdCta c = bwd_cta(p, x);
    int it0, niter;
    return bwd_piece(p, G, nq[c.item], qt, c.s, it0, niter);
  };
  int mine = 0;
  for (int x = lo; x < hi; x++) mine += has_tiles(x);
  int off = 0, total = 0;
  Scan(tmp).ExclusiveSum(mine, off, total);
  for (int x = lo; x < hi; x++)
    if (has_tiles(x)) work[off++] = x;
  if (threadIdx.x == 0) *count = total;
}

}  // namespace

size_t compact_scratch_bytes(int64_t positions) {
  if (positions <= 0 || positions > (int64_t(1) << 31) - 1) return 0;
  return 256 + size_t(positions) * sizeof(int32_t);
}

// Pieces with tiles, at most: every item one, and a split column (more than p.chunk 64-query tiles,
// 2 G a kept block, so at most 2 G kept / (chunk + 1) of them) at most G (its tiles a head / chunk
// + 1) in all (item-major chunks: its tiles / chunk + 1). kept: the kept blocks over all kv heads'
// rows (each is one query block of one column), or a bound on them.
int64_t piece_bound(const BwdParams& p, int qt, int64_t kept) {
  const int64_t full = int64_t(p.n_items) * p.n_split;
  if (p.chunk <= 0 || kept < 0) return full;
  const int64_t G = p.H / p.Hkv, sub = 128 / qt, chunk = (p.chunk + qt / 64 - 1) / (qt / 64);
  const int64_t split_cols = std::min<int64_t>(p.n_items, 2 * G * kept / (p.chunk + 1));
  return std::min(full, p.n_items + (G * sub * kept + chunk - 1) / chunk + G * split_cols);
}

int64_t compact_pieces(BwdParams& p, int qt, int64_t kept, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  const int64_t full = int64_t(p.n_items) * p.n_split;
  const size_t need = compact_scratch_bytes(full);
  if (p.n_split <= 1 || need == 0 || !scratch || scratch_bytes < need || p.n_items > kMaxItems) return full;
  int* count = static_cast<int*>(scratch);
  int32_t* work = reinterpret_cast<int32_t*>(static_cast<char*>(scratch) + 256);
  compact_kernel<<<1, kThreads, size_t(p.n_items) * sizeof(int), stream>>>(p, qt, count, work);
  SB_CUDA_CHECK_LAUNCH("compact_kernel");
  p.work = work;
  p.work_count = count;
  return piece_bound(p, qt, kept);
}

}  // namespace sb::kernels::cuda
