// The wgmma backward's compacted grid (BwdParams::work). With the column split the full grid has
// n_split CTAs an item, enough for the longest possible column, and most columns are short: at
// density 0.1, 85-88% of the GQA grid's CTAs have no tiles (bench/bwd_spare_ctas.py) and leave only
// after reading their column's length, about 1 us each, interleaved with the working CTAs
// (bench/RESULTS.md, 2026-12-04). Here CUB's select lists, on the device, the full-grid positions of
// the pieces that have tiles, in launch order; the grid is a bound on their count from the kept
// blocks, so nothing waits on the host, and the CTAs past the count leave at the end of the launch.
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"

namespace sb::kernels::cuda {
namespace {

// Whether the piece at position pos of the full grid has tiles (the kernel's own test, bwd_piece)
struct HasTiles {
  BwdParams p;
  int qt;
  __device__ bool operator()(int pos) const {
    const BwdCta c = bwd_cta(p, pos);
    const WorkItem w = bwd_item(p, c.item);
    int it0, niter;
    return bwd_piece(p, p.H / p.Hkv, w.n, qt, c.s, it0, niter);
  }
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t select_bytes(int positions) {
  size_t bytes = 0;
  SB_CUDA_CHECK(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<int>(0), static_cast<int32_t*>(nullptr),
                                      static_cast<int*>(nullptr), positions, HasTiles{}, cudaStream_t{}));
  return bytes;
}

}  // namespace

size_t compact_scratch_bytes(int64_t positions) {
  if (positions <= 0 || positions > (int64_t(1) << 31) - 1) return 0;
  return 256 + align256(size_t(positions) * sizeof(int32_t)) + align256(select_bytes(int(positions)));
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
  if (p.n_split <= 1 || need == 0 || !scratch || scratch_bytes < need) return full;  // the full grid
  char* base = static_cast<char*>(scratch);
  int* count = reinterpret_cast<int*>(base);
  int32_t* work = reinterpret_cast<int32_t*>(base + 256);
  void* tmp = base + 256 + align256(size_t(full) * sizeof(int32_t));
  size_t tmp_bytes = need - 256 - align256(size_t(full) * sizeof(int32_t));
  SB_CUDA_CHECK(cub::DeviceSelect::If(tmp, tmp_bytes, thrust::counting_iterator<int>(0), work, count, int(full),
                                      HasTiles{p, qt}, stream));
  p.work = work;
  p.work_count = count;
  return piece_bound(p, qt, kept);
}

}  // namespace sb::kernels::cuda
