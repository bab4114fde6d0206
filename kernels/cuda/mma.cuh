// Device helpers of the attention kernels: bf16 mma.sync (m16n8k16, fp32 accumulate), ldmatrix,
// cp.async, and the XOR-swizzled shared-memory tile layout (16-byte chunk c of row r stored at
// chunk c ^ (r & 7), so that ldmatrix's 8 row addresses hit 8 different bank groups).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace sb::kernels::cuda::dev {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of (row r, column c) in a swizzled tile of `cols` bf16 per row (cols % 64 == 0).
template <int cols>
__device__ __forceinline__ int swz(int r, int c) {
  return r * cols + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7);
}

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte async copy global -> shared; zero-fills the destination when !valid.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// 4-byte async copy (a float of a strided vector); zero-fills the destination when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t u) {
  __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&u);
  return __bfloat1622float2(v);
}

// Async load of a (rows x D) tile whose row r is at src + r * ld (elements); rows >= nvalid are
// zero-filled. All nthreads threads of the block take part.
template <int rows, int D, int nthreads>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int64_t ld, int nvalid, int tid) {
  constexpr int chunks = rows * (D / 8);
#pragma unroll
  for (int idx = tid; idx < chunks; idx += nthreads) {
    const int r = idx / (D / 8), c = idx % (D / 8);
    const bool ok = r < nvalid;
    const bf16* s = ok ? src + int64_t(r) * ld + c * 8 : src;
    cp_async16(smem_u32(dst + swz<D>(r, c * 8)), s, ok);
  }
}

// A fragments (16 x 16 at (r0, c0)) of a row-major swizzled tile: non-transposed ldmatrix.
template <int cols>
__device__ __forceinline__ void lds_a(uint32_t a[4], const bf16* tile, int r0, int c0, int lane) {
  const int r = r0 + (lane & 7) + ((lane >> 3) & 1) * 8, c = c0 + (lane >> 4) * 8;
  ldsm_x4(a, smem_u32(tile + swz<cols>(r, c)));
}
// B fragments for two n-tiles (n0, n0+8), k-slice k0..k0+15, from a tile stored [n][k]
// (B = tile^T): b[0],b[1] for n-tile n0; b[2],b[3] for n0+8.
template <int cols>
__device__ __forceinline__ void lds_b_nk(uint32_t b[4], const bf16* tile, int n0, int k0, int lane) {
  const int r = n0 + (lane & 7) + (lane >> 4) * 8, c = k0 + ((lane >> 3) & 1) * 8;
  ldsm_x4(b, smem_u32(tile + swz<cols>(r, c)));
}
// B fragments for two n-tiles (n0, n0+8), k-slice k0..k0+15, from a tile stored [k][n].
template <int cols>
__device__ __forceinline__ void lds_b_kn(uint32_t b[4], const bf16* tile, int k0, int n0, int lane) {
  const int r = k0 + (lane & 7) + ((lane >> 3) & 1) * 8, c = n0 + (lane >> 4) * 8;
  ldsm_x4_t(b, smem_u32(tile + swz<cols>(r, c)));
}
// A fragments (16 x 16 at (m0, k0)) of A = tile^T, tile stored [k][m].
template <int cols>
__device__ __forceinline__ void lds_a_t(uint32_t a[4], const bf16* tile, int m0, int k0, int lane) {
  const int mi = lane >> 3;
  const int r = k0 + (lane & 7) + (mi >> 1) * 8, c = m0 + (mi & 1) * 8;
  ldsm_x4_t(a, smem_u32(tile + swz<cols>(r, c)));
}

// acc (16 x N) = A B^T: A the 16 rows at arow of tA [rows][K], B^T from tB stored [n][K] (both
// swizzled with K columns); the S^T = K Q^T and dP^T = V dO^T products of the backward kernel.
template <int K, int N>
__device__ __forceinline__ void mma_abt(float (&acc)[N / 8][4], const bf16* tA, int arow, const bf16* tB, int lane) {
#pragma unroll
  for (int n = 0; n < N / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    uint32_t a[4];
    lds_a<K>(a, tA, arow, kk * 16, lane);
#pragma unroll
    for (int np = 0; np < N / 16; np++) {
      uint32_t b[4];
      lds_b_nk<K>(b, tB, np * 16, kk * 16, lane);
      mma16816(acc[2 * np], a, b[0], b[1]);
      mma16816(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}
// acc (16 x N) += a (16 x 16 A fragment, registers) B, B the k-slice k0..k0+15, columns n0..n0+N of
// tB stored [k][D]: the P V, P^T dO, dS^T Q (n0 = 0, N = D) and dS K (a warp's column slice) updates.
template <int D, int N = D>
__device__ __forceinline__ void mma_a_kn(float (&acc)[N / 8][4], const uint32_t (&a)[4], const bf16* tB, int k0,
                                         int lane, int n0 = 0) {
#pragma unroll
  for (int dp = 0; dp < N / 16; dp++) {
    uint32_t b[4];
    lds_b_kn<D>(b, tB, k0, n0 + dp * 16, lane);
    mma16816(acc[2 * dp], a, b[0], b[1]);
    mma16816(acc[2 * dp + 1], a, b[2], b[3]);
  }
}

}  // namespace sb::kernels::cuda::dev
