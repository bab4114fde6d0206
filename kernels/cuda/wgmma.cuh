// Hopper warpgroup MMA (wgmma, sm_90a) helpers for the attention kernels: shared-memory matrix
// descriptors over the 128-byte-swizzled tile layout, fences, and the four instruction shapes used
// (m64 x n64/n128 x k16, bf16 in, fp32 accumulators; A from shared memory (SS) or registers (RS)).
// Accumulator and register-A fragments have the mma.sync m16n8 layout per warp of the warpgroup:
// warp w owns rows 16w..16w+15; d[4n + e] is row (lane/4 + 8*(e/2)), column 8n + 2*(lane%4) + e%2.
// Compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); callers guard their kernels with it.
#pragma once

#include <cstdint>


namespace sb::kernels::cuda::dev {

// Byte offset of element (r, c) in a bf16 tile of R rows whose columns are split into 64-wide panels
// stored one after another (R x 128 bytes each); in a row the 16-byte chunk k sits at k ^ (r & 7).
// This is the 128-byte swizzle the descriptors below name; tiles start 1024-byte aligned.
template <int R>
__device__ __forceinline__ uint32_t sw128(int r, int c) {
  return uint32_t((c >> 6) * R * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2);
}

// Descriptor of a 128B-swizzled operand at shared address `addr`. K-major (rows of 64 k-values):
// lbo unused (16), sbo = 1024 (8 rows x 128 B). MN-major: lbo = the stride between 64-wide panels
// of the M/N dimension, sbo = 1024 (8 k-rows).
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}
// Byte offsets in a tile of R rows: K-major, row row0 and k-slice k0 (k0 % 16 == 0); MN-major, k-row
// k0 and 64-wide panel `panel` of the M/N dimension.
template <int R>
__device__ __forceinline__ uint32_t k_offset(int row0, int k0) {
  return uint32_t((k0 >> 6) * R * 128 + row0 * 128 + (k0 & 63) * 2);
}
template <int R>
__device__ __forceinline__ uint32_t mn_offset(int k0, int panel) {
  return uint32_t(panel * R * 128 + k0 * 128);
}
// K-major operand: rows row0.. of a tile with R rows, k-slice k0..k0+15 (k0 % 16 == 0).
template <int R>
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int row0, int k0) {
  return gmma_desc(tile + k_offset<R>(row0, k0), 16, 1024);
}
// MN-major operand: k-rows k0..k0+15 of a tile with R rows, M/N from 64-wide panel `panel` on.
template <int R>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int k0, int panel) {
  return gmma_desc(tile + mn_offset<R>(k0, panel), R * 128, 1024);
}

// A descriptor moved by `bytes` (a multiple of 16): only the 14-bit address field (bits 0..13, the
// address / 16 of an operand below 256 KiB) changes, so the add stays in the low word, one
// instruction where rebuilding a descriptor takes five. With desc_k(tile, row0, 0) or
// desc_mn(tile, 0, 0) as d, k_step / mn_step give desc_k(tile, row0, k0) / desc_mn(tile, k0, panel).
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
  const uint32_t lo = uint32_t(d) + (bytes >> 4), hi = uint32_t(d >> 32);
  return (uint64_t(hi) << 32) | lo;
}
template <int R>
__device__ __forceinline__ uint64_t k_step(uint64_t d, int k0) {
  return desc_add(d, k_offset<R>(0, k0));
}
template <int R>
__device__ __forceinline__ uint64_t mn_step(uint64_t d, int k0, int panel) {
  return desc_add(d, mn_offset<R>(k0, panel));
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int n>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n) : "memory");
}
// Keeps registers that an in-flight wgmma reads or writes from being reused or read early: call on
// its accumulators and register-A operands after wg_wait.
template <int n>
__device__ __forceinline__ void reg_fence(float (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int n>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; i++) asm volatile("" : "+r"(r[i])::"memory");
}
// stmatrix (sm_90): four 8 x 8 bf16 matrices from their mma fragments (r[i]: this thread's pair of
// row lane / 4 of matrix i) to shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define SB_F8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])

// D (64 x 64) (+)= A (64 x 16, shared) B (16 x 64, shared); accumulate when acc != 0.
template <int tA, int tB>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : SB_F8(d, 0), SB_F8(d, 8), SB_F8(d, 16), SB_F8(d, 24)
      : "l"(da), "l"(db), "r"(acc), "n"(tA), "n"(tB));
}
// D (64 x 64) += A (64 x 16, registers) B (16 x 64, shared).
template <int tB>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : SB_F8(d, 0), SB_F8(d, 8), SB_F8(d, 16), SB_F8(d, 24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(tB));
}

// D (64 x 128) (+)= A (64 x 16, shared) B (16 x 128, shared); accumulate when acc != 0.
template <int tA, int tB>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : SB_F8(d, 0), SB_F8(d, 8), SB_F8(d, 16), SB_F8(d, 24), SB_F8(d, 32), SB_F8(d, 40), SB_F8(d, 48), SB_F8(d, 56)
      : "l"(da), "l"(db), "r"(acc), "n"(tA), "n"(tB));
}
// D (64 x 128) += A (64 x 16, registers) B (16 x 128, shared).
template <int tB>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
      : SB_F8(d, 0), SB_F8(d, 8), SB_F8(d, 16), SB_F8(d, 24), SB_F8(d, 32), SB_F8(d, 40), SB_F8(d, 48), SB_F8(d, 56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(tB));
}

#undef SB_F8

// D (64 x N) += A (registers) B (shared), N = 64 or 128 chosen by the accumulator's size.
template <int tB, int n>
__device__ __forceinline__ void wgmma_rs(float (&d)[n], const uint32_t (&a)[4], uint64_t db) {
  static_assert(n == 32 || n == 64, "wgmma_rs: 64 x 64 or 64 x 128 accumulators");
  if constexpr (n == 64) wgmma_rs_n128<tB>(d, a, db);
  else wgmma_rs_n64<tB>(d, a, db);
}

// D (64 x N) (+)= A (shared) B (shared), N = 64 or 128 chosen by the accumulator's size.
template <int tA, int tB, int n>
__device__ __forceinline__ void wgmma_ss(float (&d)[n], uint64_t da, uint64_t db, int acc) {
  static_assert(n == 32 || n == 64, "wgmma_ss: 64 x 64 or 64 x 128 accumulators");
  if constexpr (n == 64) wgmma_ss_n128<tA, tB>(d, da, db, acc);
  else wgmma_ss_n64<tA, tB>(d, da, db, acc);
}

// mbarrier (shared memory, 8 bytes) and TMA tile loads.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) before the first load.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival that also expects `bytes` of TMA transactions in the current phase.
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One plain arrival (release): a consumer tells the producer that it is done reading a stage.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Named barriers (ids 1..15; 0 is __syncthreads): sync waits for `n` threads, arrive counts without waiting.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Waits until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// TMA: rows row0.. of head `head` of a (rows, heads, D) tensor map, 64-column panels, into the sw128
// tile at dst (R rows: panel p at dst + p * R * 128), completing `bar` with R * D * 2 bytes.
template <int R, int D>
__device__ __forceinline__ void tma_tile(uint32_t dst, const void* map, uint32_t bar, int head, int row0) {
#pragma unroll
  for (int pn = 0; pn < D / 64; pn++)
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
        ::"r"(dst + pn * R * 128), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(pn * 64), "r"(head), "r"(row0)
        : "memory");
}

// TMA store: the sw128 tile at src (R rows, 64-column panels as tma_tile loads them) to rows
// row0.. of head `head`, clipped at the tensor's end, as one bulk group of the calling thread; the
// caller waits for its reads of src (cp.async.bulk.wait_group.read) before src is rewritten.
template <int R, int D>
__device__ __forceinline__ void tma_store_tile(const void* map, uint32_t src, int head, int row0) {
#pragma unroll
  for (int pn = 0; pn < D / 64; pn++)
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src + pn * R * 128), "r"(pn * 64), "r"(head), "r"(row0)
                 : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

}  // namespace sb::kernels::cuda::dev
