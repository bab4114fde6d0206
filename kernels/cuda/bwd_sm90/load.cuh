// The wgmma backward's loads: K, V once and Q, dO a tile by TMA from thread 0, each load completing
// an mbarrier the warps wait on; lse (log2 units) and Delta a tile by cp.async.
#pragma once
#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/bwd_sm90/scheduler.cuh"
#include "kernels/cuda/bwd_sm90/tiling.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace sb::kernels::cuda::bwd90 {

// The mbarriers initialised, then K, V of the column's key block (thread 0) on the first one.
template <int D>
__device__ __forceinline__ void load_kv(const Smem<D>& s, const BwdMaps& maps, const Column& c, int tid) {
  if (tid == 0) {
    for (int x = 0; x < 1 + Tiling<D>::stages; x++) mbar_init(s.bars + 8 * x, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_expect(s.bars, 2 * Tiling<D>::TK);
    tma_tile<kBS, D>(s.k, &maps.k, s.bars, c.g, c.b.t0);
    tma_tile<kBS, D>(s.v, &maps.v, s.bars, c.g, c.b.t0);
  }
}

// Q, dO (TMA) and lse, Delta (cp.async, one commit group per tile, empty past the end) of tile it,
// called for it = 0, 1, 2, .. with `ld` its cursor; returns the tile's query block, which the loop
// uses two iterations later. Query rows past the document hold the next document's Q and dO (zeros
// past the tensor) and lse, Delta 0: their P^T is masked to 0, so they add nothing to dV, dK; their
// dQ is not written.
template <int D>
__device__ __forceinline__ int load_q(const BwdParams& p, const BwdMaps& maps, const Smem<D>& s, const Column& c,
                                      Cursor& ld, int it, int tid) {
  using T = Tiling<D>;
  constexpr int QT = T::QT;
  int i = 0;
  if (it < c.niter) {
    i = p.col_rows[c.r0 + ld.row];
    const int h = c.g * c.G + ld.hh, qt0 = c.b.doc_t0 + i * kBS + ld.sub * QT;
    const int nv = max(0, min(QT, c.doc_end - qt0));
    advance<T::kSub>(ld, c.nq);
    const int buf = it % T::stages;
    if (tid == 0) {
      mbar_expect(s.bar_q(it), 2 * T::TQ);
      tma_tile<QT, D>(s.q + buf * T::TQ, &maps.q, s.bar_q(it), h, qt0);
      tma_tile<QT, D>(s.dout + buf * T::TQ, &maps.dout, s.bar_q(it), h, qt0);
    }
    if (tid < 2 * QT) {
      const int r = tid & (QT - 1);
      const bool ok = r < nv;
      const int64_t e = ok ? (int64_t(qt0) + r) * p.H + h : 0;
      if (tid < QT) cp_async4(smem_u32(s.lse + buf * QT + r), p.lse2 + e, ok);
      else cp_async4(smem_u32(s.delta + buf * QT + r), p.delta + e, ok);
    }
  }
  cp_async_commit();
  return i;
}

}  // namespace sb::kernels::cuda::bwd90
