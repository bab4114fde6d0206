// The wgmma backward's shapes and shared-memory layout (attention_bwd_sm90.cu), shared by the kernel
// and its launcher, which sizes the shared memory.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace sb::kernels::cuda::bwd90 {
using namespace dev;

constexpr int kBS = 128, kThreads = 256;  // key block (keys a CTA), two warpgroups

// QT: queries a tile. Head_dim 64 takes 128 (n128 products, one barrier and wait set per 128
// queries: the kernel is issue-bound; 0.72x the time of 64-query tiles, bench/results/2026-12-02-hd64-bwd-128q.md), with dQ
// split by queries (warpgroup w: queries 64w.. of the tile, over all 128 keys); head_dim 128 takes
// 64 (S^T and dP^T of 128 queries would fill 128 registers), with dQ split by columns (warpgroup
// w: columns 64w..). Either way a warpgroup's dQ share is 64 rows x 64 columns, staged in shared
// memory and added by one bulk reduce-add (dq.cuh). Three Q/dO/lse/Delta stages.
template <int D>
struct Tiling {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int QT = D == 64 ? 128 : 64;
  static constexpr bool QS = QT == 128;   // dQ split by queries (else by columns)
  static constexpr int stages = 3;
  static constexpr int kSub = kBS / QT;   // tiles a query block
  static constexpr int SR = 64, NQ = 8;   // a warpgroup's dQ tile: rows, n8 column chunks
  static constexpr int SLD = NQ * 8 + 4;  // its room's row stride (floats; the tile itself is unpadded)
  static constexpr int TK = kBS * D * 2, TQ = QT * D * 2;  // bytes of a K (or V) and a Q (or dO) tile
  // K, V; stages x (Q, dO); dS^T; lse and Delta (stages x QT each); dQ staging; mbarriers; slack
  static constexpr size_t smem = size_t(2) * kBS * D * 2 + size_t(2) * stages * QT * D * 2 + size_t(kBS) * QT * 2 +
                                 size_t(2) * stages * QT * 4 + size_t(2) * SR * SLD * 4 + 8 * (1 + stages) + 8 + 1024;
  static_assert(smem <= 227 * 1024, "more shared memory than an H100/H200 SM has");
};

// Shared memory (1024-byte aligned for the 128-byte swizzle): K, V (128 keys x D, resident), Q and
// dO (stages x QT x D), dS^T (128 keys x QT queries), lse and Delta (stages x QT fp32), each
// warpgroup's fp32 dQ staging tile, then the mbarriers: K/V, then one a Q/dO stage.
template <int D>
struct Smem {
  using T = Tiling<D>;
  uint32_t k, v, q, dout, ds;  // shared addresses
  float *lse, *delta, *dq;
  uint32_t bars;
  __device__ __forceinline__ explicit Smem(unsigned char* raw) {
    const uint32_t base = (smem_u32(raw) + 1023u) & ~1023u;
    k = base, v = base + T::TK, q = base + 2 * T::TK;
    dout = q + T::stages * T::TQ;
    ds = dout + T::stages * T::TQ;
    lse = reinterpret_cast<float*>(raw + (ds + kBS * T::QT * 2 - smem_u32(raw)));
    delta = lse + T::stages * T::QT;
    dq = delta + T::stages * T::QT;
    bars = (smem_u32(dq + 2 * T::SR * T::SLD) + 7u) & ~7u;
  }
  __device__ __forceinline__ uint32_t bar_q(int t) const { return bars + 8 * (1 + t % T::stages); }  // tile t's stage
  __device__ __forceinline__ static uint32_t parity(int t) { return uint32_t(t / T::stages) & 1u; }
};

}  // namespace sb::kernels::cuda::bwd90
