// The wgmma backward's dQ: dQ = dS K over this warpgroup's share (head_dim 64: its 64 queries of
// the 128-query tile over all 128 keys; 128: its 64 columns), staged in shared memory and added
// into the tiled fp32 workspace (dq_tiled_row, attention_params.cuh) by one bulk reduce-add (the
// TMA engine: whole 128-byte lines in L2). The kernel defers it: tile it's product goes out at the
// top of tile it + 1, ahead of that tile's S^T and dP^T, and is staged under them.
#pragma once
#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/bwd_sm90/tiling.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace sb::kernels::cuda::bwd90 {

// dQ = dS K from dS^T in shared memory (one commit group, left in flight); d_ds, d_k: Descs::ds, kq.
__device__ __forceinline__ void dq_product(float (&dq)[32], uint64_t d_ds, uint64_t d_k) {
#pragma unroll
  for (int kk = 0; kk < kBS / 16; kk++) wgmma_ss<1, 1>(dq, mn_step<kBS>(d_ds, kk * 16, 0), mn_step<kBS>(d_k, kk * 16, 0), kk > 0);
  wg_commit();
}

// The finished dQ of a tile (query head h, first query qt0, nv valid rows) from the registers to
// the warpgroup's staging tile stg, then one bulk reduce-add by its first thread. The tile is rows
// of 64 floats, unpadded (the bulk copy reads one contiguous tile), their 16-byte chunks XORed with
// the token's row & 7 so that a warp's float2 stores hit distinct banks. The caller waits for the
// bulk add's reads of the tile before the next CTA barrier, after which it is rewritten.
template <int D>
__device__ __forceinline__ void dq_stage_add(const BwdParams& p, const float (&dq)[32], float* stg, int h, int qt0, int nv,
                                             int wg, int tid) {
  using T = Tiling<D>;
  const int wq = (tid >> 5) & 3, lane = tid & 31;
  const int qpanel = T::QS ? 0 : wg, qrow0 = T::QS ? 64 * wg : 0;  // the warpgroup's columns, first row
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int qr = wq * 16 + (lane >> 2) + r * 8, sw = (qt0 + qrow0 + qr) & 7;
#pragma unroll
    for (int n = 0; n < T::NQ; n++)
      *reinterpret_cast<float2*>(stg + qr * 64 + (((2 * n + ((lane & 3) >> 1)) ^ sw) << 2) + 2 * (lane & 1)) =
          make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
  }
  fence_async_smem();  // the bulk reduce reads the tile through the async proxy
  bar_sync(1 + wg, 128);
  const int rows = min(T::SR, nv - qrow0);
  if ((tid & 127) == 0 && rows > 0) {
    float* dst = p.dq_acc + dq_tiled_row(qt0 + qrow0, h, qpanel, p.n_tokens, D);
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_u32(stg)), "r"(rows * 256)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  }
}

}  // namespace sb::kernels::cuda::bwd90
