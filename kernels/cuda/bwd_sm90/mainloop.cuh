// The wgmma backward's products of one tile, per warpgroup (64 keys x QT queries):
//   S^T = K Q^T, dP^T = V dO^T (shared x shared), dV += P^T dO, dK += dS^T Q (A from registers).
// The order they are issued and waited for is the kernel's (attention_bwd_sm90.cu), as are the
// softmax and dS^T between them: each function here issues, none waits.
#pragma once
#include "kernels/cuda/bwd_sm90/tiling.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace sb::kernels::cuda::bwd90 {

// Operand descriptors, built once; each product moves them by a constant (k_step, mn_step), the
// Q/dO ones by the stage. Rebuilding them took ~5 instructions per wgmma.
struct Descs {
  uint64_t k, v;       // S^T, dP^T: A (this warpgroup's 64 keys)
  uint64_t qk, ok;     // S^T, dP^T: B (stage 0)
  uint64_t qm, om;     // dK, dV: B (stage 0)
  uint64_t ds, kq;     // dQ: A (dS^T), B (K)
};
template <int D>
__device__ __forceinline__ Descs make_descs(const Smem<D>& s, int wg) {
  using T = Tiling<D>;
  constexpr int QT = T::QT;
  const int kr0 = wg * 64, qpanel = T::QS ? 0 : wg;
  return Descs{desc_k<kBS>(s.k, kr0, 0), desc_k<kBS>(s.v, kr0, 0),  desc_k<QT>(s.q, 0, 0),
               desc_k<QT>(s.dout, 0, 0), desc_mn<QT>(s.q, 0, 0),     desc_mn<QT>(s.dout, 0, 0),
               desc_mn<kBS>(s.ds, 0, T::QS ? wg : 0), desc_mn<kBS>(s.k, 0, qpanel)};
}

// S^T = K Q^T and dP^T = V dO^T of the tile in stage buf (two commit groups).
template <int D>
__device__ __forceinline__ void st_dpt(float (&st)[Tiling<D>::QT / 2], float (&dpt)[Tiling<D>::QT / 2],
                                       const Descs& d, int buf) {
  constexpr int QT = Tiling<D>::QT;
  const uint32_t so = uint32_t(buf) * Tiling<D>::TQ;
  const uint64_t q = desc_add(d.qk, so), o = desc_add(d.ok, so);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) wgmma_ss<0, 0>(st, k_step<kBS>(d.k, kk * 16), k_step<QT>(q, kk * 16), kk > 0);
  wg_commit();
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) wgmma_ss<0, 0>(dpt, k_step<kBS>(d.v, kk * 16), k_step<QT>(o, kk * 16), kk > 0);
  wg_commit();
}

// P^T as bf16 A fragments (16 queries each), then dV += P^T dO (one commit group, left in flight).
template <int D>
__device__ __forceinline__ void dv_product(float (&dv)[D / 2], uint32_t (&pt)[Tiling<D>::QT / 16][4],
                                           const float (&st)[Tiling<D>::QT / 2], const Descs& d, int buf) {
  constexpr int KQ = Tiling<D>::QT / 16;
#pragma unroll
  for (int kk = 0; kk < KQ; kk++)
#pragma unroll
    for (int e = 0; e < 4; e++) pt[kk][e] = pack_bf16(st[8 * kk + 2 * e], st[8 * kk + 2 * e + 1]);
  wg_fence();
  const uint64_t om = desc_add(d.om, uint32_t(buf) * Tiling<D>::TQ);
#pragma unroll
  for (int kk = 0; kk < KQ; kk++) wgmma_rs<1>(dv, pt[kk], mn_step<Tiling<D>::QT>(om, kk * 16, 0));
  wg_commit();
}

// dK += dS^T Q (one commit group, left in flight).
template <int D>
__device__ __forceinline__ void dk_product(float (&dk)[D / 2], const uint32_t (&ds)[Tiling<D>::QT / 16][4],
                                           const Descs& d, int buf) {
  wg_fence();
  const uint64_t qm = desc_add(d.qm, uint32_t(buf) * Tiling<D>::TQ);
#pragma unroll
  for (int kk = 0; kk < Tiling<D>::QT / 16; kk++) wgmma_rs<1>(dk, ds[kk], mn_step<Tiling<D>::QT>(qm, kk * 16, 0));
  wg_commit();
}

// After a wait for every product: the registers they read and wrote may be used again.
template <int D>
__device__ __forceinline__ void fence_products(float (&dk)[D / 2], float (&dv)[D / 2],
                                               uint32_t (&pt)[Tiling<D>::QT / 16][4],
                                               uint32_t (&ds)[Tiling<D>::QT / 16][4]) {
  reg_fence(dk);
  reg_fence(dv);
#pragma unroll
  for (int kk = 0; kk < Tiling<D>::QT / 16; kk++) {
    reg_fence(pt[kk]);
    reg_fence(ds[kk]);
  }
}

}  // namespace sb::kernels::cuda::bwd90
