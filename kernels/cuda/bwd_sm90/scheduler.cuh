// The wgmma backward's tile scheduling: which (key block, kv head) column a CTA takes and which of
// its tiles (the column split: BwdParams, bwd_piece in attention_params.cuh), and the order the
// tiles are visited in.
#pragma once
#include "kernels/cuda/attention_params.cuh"

namespace sb::kernels::cuda::bwd90 {

// A CTA's share of one column: key block b (j = b.i) of kv head g, whose column lists the nq query
// blocks col_rows[r0..r0 + nq) that keep it, for each of the group's G query heads; the CTA takes
// its tiles [it0, it0 + niter) (head x query block x sub-tile); ok false: none (a spare piece).
struct Column {
  BlockInfo b;
  int g, G, nq, doc_end;
  int64_t r0;
  int it0, niter;
  bool ok;
};

// The CTA's position in the full grid: its own, or on the compacted grid the listed one; false:
// past the pieces with tiles (the grid is a host bound on their count), the CTA leaves.
__device__ __forceinline__ bool grid_position(const BwdParams& p, int& pos) {
  pos = int(blockIdx.x);
  if (p.work) {
    if (pos >= *p.work_count) return false;
    pos = p.work[pos];
  }
  return true;
}

// The column and tiles of full-grid position pos (bwd_cta: item-major, or piece-major windows).
template <int QT>
__device__ __forceinline__ Column column_at(const BwdParams& p, int pos) {
  const BwdCta cta = bwd_cta(p, pos);
  const WorkItem w = bwd_item(p, cta.item);
  Column c;
  c.b = w.b;
  c.g = w.g, c.G = p.H / p.Hkv, c.nq = w.n, c.doc_end = w.b.doc_t0 + w.b.doc_len;
  c.r0 = w.lo;
  int it0, niter;
  c.ok = bwd_piece(p, c.G, c.nq, QT, cta.s, it0, niter);
  c.it0 = it0, c.niter = niter;
  return c;
}

// Tile x = it0 + it = (hh * nq + row) * kSub + sub: query head g * G + hh, column entry `row` (query
// block col_rows[r0 + row]), sub-tile `sub`. Cursors step through x, one for the tile computed and
// one for the tile loaded two ahead: the kernel is issue-bound, and a division by nq and a load per
// tile cost ~70 of its ~800 instructions a tile (ncu, head_dim 64, 7 heads a group).
struct Cursor {
  int hh, row, sub;
};
template <int kSub>
__device__ __forceinline__ Cursor first_tile(const Column& c) {  // the one division
  const int rest = c.it0 / kSub, hh = c.G == 1 || c.nq == 0 ? 0 : rest / c.nq;  // nq 0: an empty column
  return Cursor{hh, rest - hh * c.nq, c.it0 % kSub};
}
template <int kSub>
__device__ __forceinline__ void advance(Cursor& u, int nq) {
  if (++u.sub == kSub) {
    u.sub = 0;
    if (++u.row == nq) u.row = 0, ++u.hh;
  }
}

}  // namespace sb::kernels::cuda::bwd90
