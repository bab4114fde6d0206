// The wgmma backward's end: dK (scaled), dV of the CTA's 128 keys out of the registers.
// - An unsplit whole key block (128 keys) with 16-byte aligned dK, dV
//   (BwdParams::tma_dkv): staged as bf16 in shared memory (the free Q and dO stages) under the last
//   dQ product and out by two TMA stores; the CTA waits only for their reads of shared memory (their
//   writes complete before the kernel does). Each thread's own bf16x2 stores, half a 32-byte
//   sector each, had taken ~7,500 of the ~10,500 cycles after a CTA's last tile; this end ~5,300
//   (bench/analysis/bwd_trace.py; bench/results/2026-12-04-bwd-per-cta.md).
// - Otherwise each thread its own rows: bf16x2 stores, or for a share of a split column fp32
//   float2 atomics into dkv_acc (dkv_convert_kernel stores the bf16). TMA reduce-adds of fp32 tiles
//   instead took as long (the L2's reductions bound both; bench/results/2026-12-03-dq-bulk-reduce.md).
#pragma once
#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/bwd_sm90/scheduler.cuh"
#include "kernels/cuda/bwd_sm90/tiling.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace sb::kernels::cuda::bwd90 {

// This thread's 16 x 16 blocks of a (128 keys, D) accumulator, scaled, as bf16 into the sw128 tile at dst.
template <int D>
__device__ __forceinline__ void stage_bf16(uint32_t dst, const float (&acc)[D / 2], float sc, int skey, int lane) {
#pragma unroll
  for (int m = 0; m < D / 16; m++) {
    const uint32_t r[4] = {pack_bf16(acc[8 * m] * sc, acc[8 * m + 1] * sc),
                           pack_bf16(acc[8 * m + 2] * sc, acc[8 * m + 3] * sc),
                           pack_bf16(acc[8 * m + 4] * sc, acc[8 * m + 5] * sc),
                           pack_bf16(acc[8 * m + 6] * sc, acc[8 * m + 7] * sc)};
    stsm_x4(dst + sw128<kBS>(skey, 16 * m + 8 * (lane >> 4)), r);
  }
}

// The staged dK, dV tiles (over the Q and dO stages) out by TMA, from thread 0.
template <int D>
__device__ __forceinline__ void store_dkv_tma(const BwdMaps& maps, const Smem<D>& s, const Column& c, int tid) {
  fence_async_smem();  // the TMA stores read the tiles through the async proxy
  __syncthreads();
  if (tid == 0) {
    tma_store_tile<kBS, D>(&maps.dk, s.q, c.g, c.b.t0);
    tma_store_tile<kBS, D>(&maps.dv, s.dout, c.g, c.b.t0);
  }
}

// Each thread its own key rows kloc, kloc + 8: bf16x2 stores, or fp32 adds for a split column.
template <int D>
__device__ __forceinline__ void store_dkv_threads(const BwdParams& p, const Column& c, bool split, const float (&dk)[D / 2],
                                                  const float (&dv)[D / 2], int kloc, int lane) {
  constexpr int DN = D / 8;  // n8 chunks of a row
  const int64_t kv_elems = p.n_tokens * p.Hkv * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int kr = kloc + r * 8;
    if (kr >= c.b.len) continue;
    const int64_t off = ((int64_t(c.b.t0) + kr) * p.Hkv + c.g) * D + 2 * (lane & 3);
    if (split) {
#pragma unroll
      for (int n = 0; n < DN; n++) {
        atomicAdd(reinterpret_cast<float2*>(p.dkv_acc + off + n * 8),
                  make_float2(dk[4 * n + 2 * r] * p.scale, dk[4 * n + 2 * r + 1] * p.scale));
        atomicAdd(reinterpret_cast<float2*>(p.dkv_acc + kv_elems + off + n * 8),
                  make_float2(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]));
      }
      continue;
    }
#pragma unroll
    for (int n = 0; n < DN; n++) {
      *reinterpret_cast<__nv_bfloat162*>(p.dk + off + n * 8) =
          __floats2bfloat162_rn(dk[4 * n + 2 * r] * p.scale, dk[4 * n + 2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(p.dv + off + n * 8) = __floats2bfloat162_rn(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]);
    }
  }
}

}  // namespace sb::kernels::cuda::bwd90
