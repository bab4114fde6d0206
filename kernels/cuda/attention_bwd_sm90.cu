// Block-sparse attention backward with Hopper warpgroup MMA (sm_90a), block size 128: one CTA of two
// warpgroups per (key block, kv head); warpgroup w owns keys 64w..64w+63 with K, V resident in
// shared memory and dK, dV in registers. It walks every query head of the group x every query block
// keeping this key block (the transposed selection) in query tiles (head_dim 64: 128 queries;
// head_dim 128: 64), Q/dO in three stages by TMA loads completing mbarriers, lse and Delta by
// cp.async:
//   S^T = K Q^T and dP^T = V dO^T (wgmma, shared x shared), P^T = exp(S^T - lse),
//   dV += P^T dO and dK += dS^T Q with P^T, dS^T = P^T (dP^T - Delta) straight from registers,
//   dQ = dS K from dS^T staged in shared memory over all 128 keys (warpgroup w takes dQ columns
//   64w.. at head_dim 128, queries 64w.. of the 128-query tile at 64), issued at the top of the
//   next tile ahead of its S^T and dP^T, staged in shared memory under them and added into the
//   fp32 workspace by one bulk reduce-add a warpgroup (the TMA engine; the workspace tiled so that
//   the staged tile is contiguous there, dq_tiled_index), which runs while the tile is computed.
// A long column is split over several CTAs (dK, dV added in fp32, then converted); with GQA it is
// cut at its query heads first, and the launch runs piece-major in windows of the SMs' items, so
// that CTAs running together read one stretch of one head's Q, dO and dQ (BwdParams::head_split).
//
// The kernel below is the schedule; its pieces are in bwd_sm90/ (the split of FlashAttention-3's hopper/
// flash_bwd_kernel_sm90.h over its mainloop, epilogue and tile-scheduler files):
//   tiling.cuh     shapes and the shared-memory layout
//   scheduler.cuh  which column and tiles a CTA takes, the tile cursor
//   load.cuh       K, V, Q, dO by TMA, lse and Delta by cp.async
//   mainloop.cuh   the products of a tile: S^T, dP^T, dV, dK (the softmax and dS^T stay in the loop)
//   dq.cuh         dQ = dS K, staged and bulk-added
//   epilogue.cuh   dK, dV out (TMA stores or each thread's)
//   trace.cuh      the per-CTA timestamps (set_bwd_trace), one hook
#include <cmath>
#include <stdexcept>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/bwd_sm90/dq.cuh"
#include "kernels/cuda/bwd_sm90/epilogue.cuh"
#include "kernels/cuda/bwd_sm90/load.cuh"
#include "kernels/cuda/bwd_sm90/mainloop.cuh"
#include "kernels/cuda/bwd_sm90/scheduler.cuh"
#include "kernels/cuda/bwd_sm90/tiling.cuh"
#include "kernels/cuda/bwd_sm90/trace.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/tma.hpp"

namespace sb::kernels::cuda {
namespace {
using namespace bwd90;

// Iteration it: dQ of tile it - 1 goes out first (deferred), then S^T and dP^T of tile it; dQ of
// it - 1 is staged and added under them, the exponentials run under dP^T; then dV, dK. One CTA
// barrier per tile: dS^T is complete in shared memory, tile it + 1 has landed in every thread, and
// every warp is past iteration it - 1, whose stage tile it + 2 then takes. Nothing is in flight
// across iterations: a product in flight over the back edge made ptxas serialize every wgmma
// (warning C7514), hence dQ issued at the top of the next tile rather than at the end of its own.
// Deferring dQ took 0.96-1.04x the time of staging it right after its product (bench/results/2026-12-03-dq-deferred.md,
// "dQ deferred to the next tile"); issuing dK after dQ (FlashAttention-3's order) 1.00-1.07x.
template <int D>
__global__ void __launch_bounds__(kThreads, 1) bwd_sm90_kernel(const BwdParams p, const __grid_constant__ BwdMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Tiling<D>;
  constexpr int QT = T::QT;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Smem<D> s(smem_raw);
  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  const Trace trace(p.trace, p.trace_ctas, tid);
  trace.start();
  int pos;
  if (!grid_position(p, pos)) return;  // past the pieces with tiles: the whole CTA leaves
  const Column c = column_at<QT>(p, pos);
  if (!c.ok) return;  // a spare piece: the whole CTA leaves
  const bool split = bwd_column_split(p, c.G, c.nq);  // a share of the column: dK, dV added in fp32
  load_kv<D>(s, maps, c, tid);
  const Cursor first = first_tile<T::kSub>(c);
  Cursor ld = first;  // the tile loaded, two ahead of the tile computed

  float dk[D / 2], dv[D / 2];  // (64 keys of this warpgroup, D)
#pragma unroll
  for (int n = 0; n < D / 2; n++) dk[n] = dv[n] = 0.f;
  const int kr0 = wg * 64;                                              // this warpgroup's keys in the block
  const int kloc = kr0 + wq * 16 + (lane >> 2);                         // this thread's key rows: kloc, kloc + 8
  const int kpos0 = c.b.i * kBS + kloc;                                 // the first of them in the document
  const int skey = kr0 + wq * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);  // its dS^T row for stmatrix
  const Descs d = make_descs<D>(s, wg);
  float st[QT / 2], dpt[QT / 2];  // S^T, dP^T: (64 keys, QT queries)
  int i_cur = load_q<D>(p, maps, s, c, ld, 0, tid), i_next = load_q<D>(p, maps, s, c, ld, 1, tid);  // their query blocks
  cp_async_wait<1>();
  __syncthreads();       // lse, Delta of tile 0 from every thread
  mbar_wait(s.bars, 0);  // K, V

  float* stg = s.dq + wg * T::SR * T::SLD;  // this warpgroup's dQ staging tile
  int ph = 0, pqt0 = 0, pnv = 0;            // the previous tile's dQ destination
  float dq[32];                             // dQ: (64 queries, 64 columns)
  Cursor cur = first;
  trace.stamp(kFirstTile);
  for (int it = 0; it < c.niter; it++) {
    const int buf = it % T::stages;
    const float* tL = s.lse + buf * QT;
    const float* tDl = s.delta + buf * QT;
    const int i = i_cur, h = c.g * c.G + cur.hh, qt0 = c.b.doc_t0 + i * kBS + cur.sub * QT;
    const int nv = max(0, min(QT, c.doc_end - qt0));
    const bool diag = (i == c.b.i);
    const int qpos0 = qt0 - c.b.doc_t0 + 2 * (lane & 3);

    mbar_wait(s.bar_q(it), Smem<D>::parity(it));
    // The previous tile's dQ goes out first, this tile's S^T and dP^T behind it. At tile 0 a
    // throwaway product of whatever dS^T holds (never staged): one order of wgmma groups on every
    // path, which ptxas needs to keep them asynchronous (C7514 otherwise).
    wg_fence();
    dq_product(dq, d.ds, d.kq);
    st_dpt<D>(st, dpt, d, buf);
    wg_wait<2>();  // the previous tile's dQ (this tile's S^T, dP^T in flight)
    reg_fence(dq);
    if (it > 0) {
      bar_arrive(3 + wg, 256);  // done reading its dS^T
      dq_stage_add<D>(p, dq, stg, ph, pqt0, pnv, wg, tid);
    }
    ph = h, pqt0 = qt0, pnv = nv;

    wg_wait<1>();  // S^T; dP^T may still run, under the exponentials
    reg_fence(st);
    // P^T = exp2(S^T * scale*log2e - lse*log2e) (tL: lse*log2e); causal on the diagonal block,
    // query columns past the document zeroed on the document's last tile (a separate loop: most
    // tiles need neither). Here, not in mainloop.cuh: as a function it changed ptxas's register
    // allocation (a spill at head_dim 64).
    if (diag || nv < QT) {
#pragma unroll
      for (int n = 0; n < QT / 8; n++) {
        const float2 l = *reinterpret_cast<const float2*>(tL + n * 8 + 2 * (lane & 3));
        const int qc = n * 8 + 2 * (lane & 3);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float x = ex2(fmaf(st[4 * n + e], p.scale_log2, -((e & 1) ? l.y : l.x)));
          if ((diag && kpos0 + (e >> 1) * 8 > qpos0 + n * 8 + (e & 1)) || qc + (e & 1) >= nv) x = 0.f;
          st[4 * n + e] = x;
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < QT / 8; n++) {
        const float2 l = *reinterpret_cast<const float2*>(tL + n * 8 + 2 * (lane & 3));
#pragma unroll
        for (int e = 0; e < 4; e++) st[4 * n + e] = ex2(fmaf(st[4 * n + e], p.scale_log2, -((e & 1) ? l.y : l.x)));
      }
    }
    uint32_t pt[QT / 16][4], ds[QT / 16][4];  // bf16 A fragments (16 queries each) of P^T and dS^T
    dv_product<D>(dv, pt, st, d, buf);        // in flight while dS^T is formed
    wg_wait<1>();  // dP^T (dV in flight)
    reg_fence(dpt);
    // dS^T = P^T (dP^T - Delta): registers for dK, shared memory for dQ (here for the reason above:
    // a spill at head_dim 128). The other warpgroup's dQ of the previous tile reads our rows of
    // dS^T: wait for its arrival.
    if (it > 0) bar_sync(3 + (wg ^ 1), 256);
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
      const float2 dl = *reinterpret_cast<const float2*>(tDl + n * 8 + 2 * (lane & 3));
      const uint32_t lo = pack_bf16(st[4 * n] * (dpt[4 * n] - dl.x), st[4 * n + 1] * (dpt[4 * n + 1] - dl.y));
      const uint32_t hi = pack_bf16(st[4 * n + 2] * (dpt[4 * n + 2] - dl.x), st[4 * n + 3] * (dpt[4 * n + 3] - dl.y));
      ds[n / 2][(n & 1) * 2] = lo;
      ds[n / 2][(n & 1) * 2 + 1] = hi;
      // the 16 x 16 block (the warp's keys, queries 16 (n / 2)..) in one stmatrix, not 8 stores
      if (n & 1) stsm_x4(s.ds + sw128<kBS>(skey, 8 * (n - 1) + 8 * (lane >> 4)), ds[n / 2]);
    }
    dk_product<D>(dk, ds, d, buf);

    cp_async_wait<0>();  // lse, Delta of tile it + 1, the only group in flight
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the staging tile read
    fence_async_smem();  // dS^T is read by wgmma next
    __syncthreads();
    const int i_after = load_q<D>(p, maps, s, c, ld, it + 2, tid);
    wg_wait<0>();  // dV, dK (dQ goes out at the next tile)
    fence_products<D>(dk, dv, pt, ds);
    i_cur = i_next, i_next = i_after;
    advance<T::kSub>(cur, c.nq);
  }
  trace.stamp(kLastTile);

  // The last dQ; an unsplit whole key block's dK, dV staged under it for the TMA stores.
  // (store_dkv a lambda: called directly, ptxas spills 12 bytes at head_dim 128)
  auto store_dkv = [&] { store_dkv_threads<D>(p, c, split, dk, dv, kloc, lane); };
  const bool tma_dkv = p.tma_dkv && !split && c.b.len == kBS;
  wg_fence();
  dq_product(dq, d.ds, d.kq);
  if (tma_dkv) {
    stage_bf16<D>(s.q, dk, p.scale, skey, lane);  // dK tile over the Q stages
    stage_bf16<D>(s.dout, dv, 1.f, skey, lane);   // dV over the dO stages
  }
  wg_wait<0>();
  reg_fence(dq);
  if (c.niter > 0) dq_stage_add<D>(p, dq, stg, ph, pqt0, pnv, wg, tid);
  if (tma_dkv) store_dkv_tma<D>(maps, s, c, tid);
  trace.stamp(kDqStaged);
  cp_async_wait<0>();
  if (tma_dkv) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  trace.stamp(kDrained);
  if (!tma_dkv) store_dkv();
  trace.end(p, c.niter);
#else
  __trap();  // built without sm_90a: use_sm90() keeps this kernel from being launched
#endif
}

template <int D>
void launch(const BwdParams& p, int64_t n_tokens, const BwdCompact& c, cudaStream_t stream) {
  using T = Tiling<D>;
  SB_CUDA_CHECK(cudaFuncSetAttribute(bwd_sm90_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::smem)));
  // dK, dV by TMA stores where their bases allow a tensor map (16-byte aligned)
  BwdParams pp = p;
  pp.tma_dkv = reinterpret_cast<uintptr_t>(p.dk) % 16 == 0 && reinterpret_cast<uintptr_t>(p.dv) % 16 == 0;
  const CUtensorMap mk = tile_map(p.k, n_tokens, p.Hkv, D, kBS), mv = tile_map(p.v, n_tokens, p.Hkv, D, kBS);
  const BwdMaps maps{tile_map(p.q, n_tokens, p.H, D, T::QT), tile_map(p.dout, n_tokens, p.H, D, T::QT), mk, mv,
                     pp.tma_dkv ? tile_map(p.dk, n_tokens, p.Hkv, D, kBS) : mk,
                     pp.tma_dkv ? tile_map(p.dv, n_tokens, p.Hkv, D, kBS) : mv};
  const int64_t grid = c.on ? compact_pieces(pp, T::QT, c.kept, c.scratch, c.bytes, stream) : int64_t(p.n_items) * p.n_split;
  bwd_sm90_kernel<D><<<unsigned(grid), kThreads, T::smem, stream>>>(pp, maps);
  SB_CUDA_CHECK_LAUNCH("bwd_sm90_kernel");
}
}  // namespace

// head_dim 128 splits dQ by columns (the key split there was 1.26x slower), head_dim 64 takes
// 128-query tiles with dQ split by queries (0.72x the time of 64-query tiles at the Qwen2.5-0.5B
// shape); dQ by one bulk reduce-add a staged tile into the tiled workspace (0.88-0.95x the time of
// float4 atomics), deferred to the next tile; bench/results/2026-12-03-dq-bulk-reduce.md, 2026-12-03-dq-deferred.md.
void launch_bwd_sm90(const BwdParams& p, int head_dim, int64_t n_tokens, const BwdCompact& compact, cudaStream_t stream) {
  if (head_dim == 128) launch<128>(p, n_tokens, compact, stream);
  else if (head_dim == 64) launch<64>(p, n_tokens, compact, stream);
  else throw Error("cuda::launch_bwd_sm90: head_dim must be 64 or 128");
}

}  // namespace sb::kernels::cuda
