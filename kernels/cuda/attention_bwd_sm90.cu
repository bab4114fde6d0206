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
#include <cmath>
#include <stdexcept>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tma.hpp"
#include "kernels/cuda/wgmma.cuh"

namespace sb::kernels::cuda {
namespace {
using namespace dev;

constexpr int kBS = 128, kThreads = 256;

// QT: queries a tile, 64 or 128 (head_dim 64 only: S^T and dP^T of 128 queries fill 128 registers).
// A 128-query tile issues fewer instructions per product (n128 wgmmas, one barrier and wait set per
// 128 queries: the kernel is issue-bound). Its Q/dO stages are twice the size: with the query split
// three still fit; with the key split (its dQ staging twice as large) two, a stage freed by waiting
// for dK, dV before the tile's CTA barrier ("empty" mbarriers instead, FlashAttention-3's way,
// measured the same: bench/RESULTS.md).
// KS (key split): each warpgroup adds dQ of its own 64 keys (QT queries x D), so dS^T need only be
// visible within the warpgroup; otherwise warpgroup w takes, over all 128 keys, dQ columns 64w..
// (head_dim 128) or, with 128-query tiles, queries 64w.. (QS, the query split): half the atomics
// and staging but a CTA-wide barrier. At head_dim 64 the query split takes 0.78-0.85x the key
// split's time (bench/RESULTS.md): dQ's atomics, not the tensor cores, were the bound.
// The shape decisions, shared by the kernel and its launcher (which sizes the shared memory).
template <int D, bool KS, int QT>
struct Tiling {
  static constexpr bool QS = !KS && QT == 128;          // the query split
  static constexpr int stages = QT == 64 || QS ? 3 : 2;  // Q/dO/lse/Delta stages (shared memory decides)
  static constexpr int SR = QS ? 64 : QT;                // rows of a warpgroup's dQ staging tile
  static constexpr int NQ = KS || QS ? D / 8 : 8;        // n8 column chunks of dQ per warpgroup
  static constexpr int SLD = NQ * 8 + 4;                 // staging row stride (floats)
  // K, V; stages x (Q, dO); dS^T; lse and Delta (stages x QT each); dQ staging; mbarriers; slack
  static constexpr size_t smem = size_t(2) * kBS * D * 2 + size_t(2) * stages * QT * D * 2 + size_t(kBS) * QT * 2 +
                                 size_t(2) * stages * QT * 4 + size_t(2) * SR * SLD * 4 + 8 * (1 + stages) + 8 + 1024;
  static_assert(smem <= 227 * 1024, "more shared memory than an H100/H200 SM has");
};

// BT: the staged dQ tile added by one bulk reduce-add into the tiled workspace (the default);
// otherwise by float4 atomics of every thread under the next tile's first products (variant 7;
// the bulk path takes 0.88-0.95x its backward time at 8K-32K, bench/RESULTS.md: it adds whole
// 128-byte lines in L2 and takes 16-32 instructions a thread a tile off the warps).
// DQD (deferred dQ; with BT, the default): dQ = dS K of tile it goes out at the top of tile it + 1,
// ahead of its S^T and dP^T, and is staged and added under them; otherwise it goes out after the
// tile's CTA barrier and is waited for and staged with no product in flight (variant 8; 0.96-1.04x
// the default's time, bench/RESULTS.md). Issuing dK after dQ instead, so that it runs while dQ is
// staged (FlashAttention-3's order), was slower at head_dim 128 (1.00-1.07x).
template <int D, bool KS, int QT, bool BT, bool DQD = false>
__global__ void __launch_bounds__(kThreads, 1) bwd_sm90_kernel(const BwdParams p, const __grid_constant__ BwdMaps maps) {
  using T = Tiling<D, KS, QT>;
  constexpr bool QS = T::QS;
  static_assert(!DQD || (BT && T::stages == 3), "deferred dQ: the bulk tile, three stages");
  static_assert(KS || QS || D == 128, "the column split needs head_dim 128");
  static_assert(QT == 64 || (QT == 128 && D == 64), "128-query tiles: head_dim 64");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = T::stages, SR = T::SR, NQ = T::NQ, SLD = T::SLD;
  constexpr int kSub = kBS / QT;        // tiles a query block
  constexpr int NH = KS ? QT / 64 : 1;  // dQ products of a warpgroup (64 queries each)
  constexpr int TK = kBS * D * 2, TQ = QT * D * 2, DN = D / 8;  // tile bytes; n8 chunks of dK/dV
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = base, sV = base + TK, sQ = base + 2 * TK;  // Q: kStages buffers
  const uint32_t sdO = sQ + kStages * TQ;                        // kStages buffers
  const uint32_t sdS = sdO + kStages * TQ;                       // dS^T (128 keys x QT queries)
  float* sL = reinterpret_cast<float*>(smem_raw + (sdS + kBS * QT * 2 - smem_u32(smem_raw)));  // kStages x QT
  float* sDl = sL + kStages * QT;                                                              // kStages x QT
  float* sdQ = sDl + kStages * QT;  // fp32 dQ staging, per warpgroup SR x SLD
  const uint32_t bars = (smem_u32(sdQ + 2 * SR * SLD) + 7u) & ~7u;  // mbarriers: K/V, then Q/dO stages
  auto barQ = [&](int t) { return bars + 8 * (1 + t % kStages); };
  auto parity = [](int t) { return uint32_t(t / kStages) & 1u; };

  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  // set_bwd_trace: each stamp stored at once (nothing held in registers across the loop)
  unsigned long long* const trace =
      p.trace && tid == 0 && int64_t(blockIdx.x) < p.trace_ctas ? p.trace + 16 * int64_t(blockIdx.x) : nullptr;
  auto stamp = [&](int slot) {
    if (trace) trace[slot] = clock64();
  };
  auto globaltimer = [] {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  if (trace) {
    trace[0] = globaltimer();
    stamp(4);
  }
  // The CTA's position in the full grid: its own, or on the compacted grid the listed one
  int pos = int(blockIdx.x);
  if (p.work) {
    if (pos >= *p.work_count) return;  // past the pieces with tiles: the whole CTA leaves
    pos = p.work[pos];
  }
  const BwdCta cta = bwd_cta(p, pos);
  const WorkItem w = bwd_item(p, cta.item);
  const BlockInfo b = w.b;  // key block j = b.i
  const int g = w.g, G = p.H / p.Hkv, nq = w.n, doc_end = b.doc_t0 + b.doc_len;
  const int64_t r0 = w.lo;
  // The column's tiles (head x query block x sub-tile) this CTA takes (the column split: bwd_piece)
  int it0, niter;
  if (!bwd_piece(p, G, nq, QT, cta.s, it0, niter)) return;  // a spare piece: the whole CTA leaves
  const bool split = bwd_column_split(p, G, nq);  // a share of the column (dK, dV in fp32)

  // K, V, Q and dO by TMA from thread 0, each load completing an mbarrier; lse and Delta by cp.async.
  if (tid == 0) {
    for (int x = 0; x < 1 + kStages; x++) mbar_init(bars + 8 * x, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_expect(bars, 2 * TK);
    tma_tile<kBS, D>(sK, &maps.k, bars, g, b.t0);
    tma_tile<kBS, D>(sV, &maps.v, bars, g, b.t0);
  }
  // Tile it is x = it0 + it = (hh * nq + row) * kSub + sub: query head g * G + hh, column row `row`
  // (query block col_rows[r0 + row]), sub-tile `sub`. Two cursors step through x, one for the tile
  // computed and one for the tile loaded two ahead: the kernel is issue-bound, and a division by nq
  // and a load per tile cost ~70 of its ~800 instructions a tile (ncu, head_dim 64, 7 heads a group).
  struct Cursor {
    int hh, row, sub;
  };
  const Cursor first = [&] {  // tile 0 (x = it0): the one division
    const int rest = it0 / kSub, hh = G == 1 || nq == 0 ? 0 : rest / nq;  // nq 0: an empty column
    return Cursor{hh, rest - hh * nq, it0 % kSub};
  }();
  auto advance = [&](Cursor& c) {
    if (++c.sub == kSub) {
      c.sub = 0;
      if (++c.row == nq) c.row = 0, ++c.hh;
    }
  };
  // Q, dO (TMA) and lse, Delta (cp.async, one commit group per tile, empty past the end) of tile
  // it (called for it = 0, 1, 2, ..: `ld` is its cursor); returns the tile's query block, which the
  // loop uses two iterations later. Query rows past the document hold the next document's Q and dO
  // (zeros past the tensor) and lse, Delta 0: their P^T is masked to 0, so they add nothing to dV,
  // dK; their dQ is not written.
  Cursor ld = first;
  auto issue = [&](int it) {
    int i = 0;
    if (it < niter) {
      i = p.col_rows[r0 + ld.row];
      const int h = g * G + ld.hh, qt0 = b.doc_t0 + i * kBS + ld.sub * QT;
      const int nv = max(0, min(QT, doc_end - qt0));
      advance(ld);
      const int buf = it % kStages;
      if (tid == 0) {
        mbar_expect(barQ(it), 2 * TQ);
        tma_tile<QT, D>(sQ + buf * TQ, &maps.q, barQ(it), h, qt0);
        tma_tile<QT, D>(sdO + buf * TQ, &maps.dout, barQ(it), h, qt0);
      }
      if (tid < 2 * QT) {
        const int r = tid & (QT - 1);
        const bool ok = r < nv;
        const int64_t e = ok ? (int64_t(qt0) + r) * p.H + h : 0;
        if (tid < QT) cp_async4(smem_u32(sL + buf * QT + r), p.lse2 + e, ok);
        else cp_async4(smem_u32(sDl + buf * QT + r), p.delta + e, ok);
      }
    }
    cp_async_commit();
    return i;
  };

  float dk[D / 2], dv[D / 2];  // (64 keys of this warpgroup, D)
#pragma unroll
  for (int n = 0; n < D / 2; n++) dk[n] = dv[n] = 0.f;
  const int kr0 = wg * 64;                                   // this warpgroup's keys in the block
  const int kloc = kr0 + wq * 16 + (lane >> 2);              // this thread's key rows: kloc, kloc + 8
  const int kpos0 = b.i * kBS + kloc;
  const int skey = kr0 + wq * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);  // its dS^T row for stmatrix
  constexpr int QK = KS ? 4 : 8;  // dQ k-steps (16 keys each)
  const int qkey0 = KS ? kr0 : 0, qpanel = KS || QS ? 0 : wg;  // dQ: first key, column panel
  const int qrow0 = QS ? 64 * wg : 0;                          // dQ: first query row in the tile

  // Operand descriptors built once; each product moves them by a constant (k_step, mn_step), the
  // Q/dO ones by the stage. Rebuilding them took ~5 instructions per wgmma.
  const uint64_t dK = desc_k<kBS>(sK, kr0, 0), dV = desc_k<kBS>(sV, kr0, 0);  // S^T, dP^T: A
  const uint64_t dQk = desc_k<QT>(sQ, 0, 0), dOk = desc_k<QT>(sdO, 0, 0);     // S^T, dP^T: B
  const uint64_t dQm = desc_mn<QT>(sQ, 0, 0), dOm = desc_mn<QT>(sdO, 0, 0);   // dK, dV: B
  const uint64_t dSm = desc_mn<kBS>(sdS, qkey0, QS ? wg : 0), dKm = desc_mn<kBS>(sK, qkey0, qpanel);  // dQ

  float st[QT / 2], dpt[QT / 2];  // S^T, dP^T: (64 keys, QT queries)
  // S^T = K Q^T and dP^T = V dO^T of iteration it (two commit groups)
  auto st_dpt = [&](int it) {
    const uint32_t so = uint32_t(it % kStages) * TQ;
    const uint64_t q = desc_add(dQk, so), o = desc_add(dOk, so);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_ss<0, 0>(st, k_step<kBS>(dK, kk * 16), k_step<QT>(q, kk * 16), kk > 0);
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_ss<0, 0>(dpt, k_step<kBS>(dV, kk * 16), k_step<QT>(o, kk * 16), kk > 0);
    wg_commit();
  };

  int i_cur = issue(0), i_next = issue(1);  // query blocks of tiles it, it + 1
  cp_async_wait<1>();
  __syncthreads();  // lse, Delta of tile 0 from every thread
  mbar_wait(bars, 0);  // K, V

  float* stg = sdQ + wg * SR * SLD;
  // float4 atomics of a staged dQ tile, a warp on two consecutive rows: thread wt takes column
  // chunk wt % 16 of rows wt / 16 + 8j (the address once, then a stride; no row test on a full
  // tile: the index arithmetic and tests were ~120 of ~800 instructions a tile). The tile is
  // rewritten only after the next CTA barrier, which every thread of the warpgroup reaches after
  // these reads.
  static_assert(NQ * 2 == 16, "16 float4 a staged row");
  auto add_staged = [&](int h, int qt0, int nv) {
    const int wt = tid & 127, r = wt >> 4, c4 = 4 * (wt & 15);
    const int64_t step = int64_t(8) * p.H * D;  // 8 rows
    float* dst = p.dq_acc + ((int64_t(qt0) + qrow0 + r) * p.H + h) * D + qpanel * 64 + c4;
    const float* src = stg + r * SLD + c4;
    if (nv == QT) {  // all but a document's last tile
#pragma unroll
      for (int j = 0; j < SR / 8; j++)
        atomicAdd(reinterpret_cast<float4*>(dst + j * step), *reinterpret_cast<const float4*>(src + j * 8 * SLD));
    } else {
#pragma unroll
      for (int j = 0; j < SR / 8; j++)
        if (qrow0 + r + 8 * j < nv)
          atomicAdd(reinterpret_cast<float4*>(dst + j * step), *reinterpret_cast<const float4*>(src + j * 8 * SLD));
    }
  };

  // Iteration it: S^T and dP^T of tile it go out first, the staged dQ atomics of tile it - 1 run
  // under them, the exponentials under dP^T; then dV, dK, dQ. One CTA barrier per tile. Three
  // stages: tile it + 1 lands during iterations it - 1 .. it, it + 2 goes out right after the
  // barrier. Two: the same, with dK and dV finished before the barrier so that tile it's stage is
  // free for it + 2.
  // dQ: staged and added by one bulk reduce-add (BT, the default) or by float4 atomics, or, for
  // comparison at 64 queries a tile, variants 1 and 2
  const int dq_variant = QT == 64 ? p.variant : 0;
  static_assert(!BT || !KS, "the bulk tile: dQ split by columns or queries");
  const bool staged_atomics = dq_variant != 1 && dq_variant != 2 && !BT;
  int ph = 0, pqt0 = 0, pnv = 0;  // the previous tile's dQ destination
  // dQ = dS K over this warpgroup's share: its keys (QT queries, D, one product per 64-query
  // half: panel hf of dS^T), its columns (64 queries, 64 columns) or its queries (64 queries, D)
  float dq[NH][KS || QS ? D / 2 : 32];
  // BT: dQ staged as rows of 64 floats, unpadded (the bulk copy reads one contiguous tile), their
  // 16-byte chunks XORed with the token's row & 7 so that a warp's float2 stores hit distinct
  // banks, then added by one bulk reduce-add, whose reads of the tile are waited for before the
  // next CTA barrier
  auto bulk_stage = [&](int h, int qt0, int nv) {
    static_assert(!BT || (NH == 1 && NQ == 8), "one 64-column panel a warpgroup");
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int qr = wq * 16 + (lane >> 2) + r * 8, sw = (qt0 + qrow0 + qr) & 7;
#pragma unroll
      for (int n = 0; n < NQ; n++)
        *reinterpret_cast<float2*>(stg + qr * 64 + (((2 * n + ((lane & 3) >> 1)) ^ sw) << 2) + 2 * (lane & 1)) =
            make_float2(dq[0][4 * n + 2 * r], dq[0][4 * n + 2 * r + 1]);
    }
    fence_async_smem();  // the bulk reduce reads the tile through the async proxy
    bar_sync(1 + wg, 128);
    const int rows = min(SR, nv - qrow0);
    if ((tid & 127) == 0 && rows > 0) {
      float* dst = p.dq_acc + dq_tiled_row(qt0 + qrow0, h, qpanel, p.n_tokens, D);
      asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                   "r"(smem_u32(stg)), "r"(rows * 256)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
  };
  auto dq_product = [&] {
#pragma unroll
    for (int hf = 0; hf < NH; hf++)
#pragma unroll
      for (int kk = 0; kk < QK; kk++)
        wgmma_ss<1, 1>(dq[hf], mn_step<kBS>(dSm, kk * 16, hf), mn_step<kBS>(dKm, kk * 16, 0), kk > 0);
    wg_commit();
  };
  Cursor cur = first;
  stamp(5);
  for (int it = 0; it < niter; it++) {
    const int buf = it % kStages;
    const uint32_t so = uint32_t(buf) * TQ;
    const float* tL = sL + buf * QT;
    const float* tDl = sDl + buf * QT;
    const int i = i_cur, h = g * G + cur.hh, qt0 = b.doc_t0 + i * kBS + cur.sub * QT;
    const int nv = max(0, min(QT, doc_end - qt0));
    const bool diag = (i == b.i);
    const int qpos0 = qt0 - b.doc_t0 + 2 * (lane & 3);

    mbar_wait(barQ(it), parity(it));
    // Deferred dQ: the previous tile's dQ goes out first, with this tile's S^T and dP^T behind it.
    // At tile 0 a throwaway product of whatever dS^T holds (never staged): one order of wgmma groups
    // on every path, which ptxas needs to keep them asynchronous (C7514 otherwise).
    if constexpr (DQD) {
      wg_fence();
      dq_product();
    }
    st_dpt(it);
    if (it > 0 && staged_atomics) add_staged(ph, pqt0, pnv);
    if constexpr (DQD) {
      wg_wait<2>();  // the previous tile's dQ (this tile's S^T, dP^T in flight)
#pragma unroll
      for (int hf = 0; hf < NH; hf++) reg_fence(dq[hf]);
      if (it > 0) {
        bar_arrive(3 + wg, 256);  // done reading its dS^T
        bulk_stage(ph, pqt0, pnv);
      }
    }
    ph = h, pqt0 = qt0, pnv = nv;

    wg_wait<1>();  // S^T; dP^T may still run, under the exponentials
    reg_fence(st);
    // P^T = exp2(S^T * scale*log2e - lse*log2e) (lse2: lse*log2e); causal on the diagonal block, query columns past
    // the document zeroed on the document's last tile (a separate loop: most tiles need neither)
    if (diag || nv < QT) {
#pragma unroll
      for (int n = 0; n < QT / 8; n++) {
        const float2 l = *reinterpret_cast<const float2*>(tL + n * 8 + 2 * (lane & 3));  // lse, log2 units
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
    constexpr int KQ = QT / 16;  // k-steps of dV and dK (16 queries each)
    uint32_t pt[KQ][4], ds[KQ][4];  // bf16 A fragments (16 queries each) of P^T and dS^T
#pragma unroll
    for (int kk = 0; kk < KQ; kk++)
#pragma unroll
      for (int e = 0; e < 4; e++) pt[kk][e] = pack_bf16(st[8 * kk + 2 * e], st[8 * kk + 2 * e + 1]);
    // dV += P^T dO (in flight while dS^T is formed)
    wg_fence();
    const uint64_t om = desc_add(dOm, so);
#pragma unroll
    for (int kk = 0; kk < KQ; kk++) wgmma_rs<1>(dv, pt[kk], mn_step<QT>(om, kk * 16, 0));
    wg_commit();
    wg_wait<1>();  // dP^T (dV in flight)
    reg_fence(dpt);
    // dS^T = P^T (dP^T - Delta): registers for dK, shared memory for dQ. With the column split
    // the other warpgroup's dQ of the previous tile reads our rows of dS^T: wait for its arrival.
    if constexpr (!KS)
      if (it > 0) bar_sync(3 + (wg ^ 1), 256);
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
      const float2 d = *reinterpret_cast<const float2*>(tDl + n * 8 + 2 * (lane & 3));
      const uint32_t lo = pack_bf16(st[4 * n] * (dpt[4 * n] - d.x), st[4 * n + 1] * (dpt[4 * n + 1] - d.y));
      const uint32_t hi = pack_bf16(st[4 * n + 2] * (dpt[4 * n + 2] - d.x), st[4 * n + 3] * (dpt[4 * n + 3] - d.y));
      ds[n / 2][(n & 1) * 2] = lo;
      ds[n / 2][(n & 1) * 2 + 1] = hi;
      // the 16 x 16 block (the warp's keys, queries 16 (n / 2)..) in one stmatrix, not 8 stores
      if (n & 1) stsm_x4(sdS + sw128<kBS>(skey, 8 * (n - 1) + 8 * (lane >> 4)), ds[n / 2]);
    }
    // dK += dS^T Q
    wg_fence();
    const uint64_t qm = desc_add(dQm, so);
#pragma unroll
    for (int kk = 0; kk < KQ; kk++) wgmma_rs<1>(dk, ds[kk], mn_step<QT>(qm, kk * 16, 0));
    wg_commit();
    // after a wait for every product: the registers they read and wrote may be used again
    auto fence_products = [&] {
      reg_fence(dk);
      reg_fence(dv);
#pragma unroll
      for (int kk = 0; kk < KQ; kk++) {
        reg_fence(pt[kk]);
        reg_fence(ds[kk]);
      }
    };
    if constexpr (kStages == 2) {  // tile it's Q, dO read: its stage takes tile it + 2 after the barrier
      wg_wait<0>();
      fence_products();
    }
    // One CTA barrier per tile: dS^T is complete in shared memory, tile it + 1 has landed in every
    // thread, and every warp is past iteration it - 1 (three stages: its stage is that of it + 2).
    cp_async_wait<0>();  // lse, Delta of tile it + 1, the only group in flight
    if (dq_variant == 2 || BT) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // staging tile read
    fence_async_smem();  // dS^T is read by wgmma next
    __syncthreads();
    const int i_after = issue(it + 2);
    if constexpr (DQD) {
      wg_wait<0>();  // dV, dK (dQ goes out at the next tile)
      fence_products();
      i_cur = i_next, i_next = i_after;
      advance(cur);
      continue;
    }
    wg_fence();
    dq_product();
    wg_wait<0>();
    fence_products();
#pragma unroll
    for (int hf = 0; hf < NH; hf++) reg_fence(dq[hf]);
    if constexpr (!KS)  // done reading dS^T: the other warpgroup may overwrite its rows
      if (it + 1 < niter) bar_arrive(3 + wg, 256);
    // dQ leaves the registers (staged in shared memory; added at the top of the next iteration,
    // under its first products, or after the loop) without holding 32-64 more registers there.
    if (dq_variant == 1) {  // float2 atomics straight from the registers, not overlapped
#pragma unroll
      for (int hf = 0; hf < NH; hf++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const int qr = hf * 64 + wq * 16 + (lane >> 2) + r * 8;
          if (qr < nv) {
            float* dst = p.dq_acc + ((int64_t(qt0) + qr) * p.H + h) * D + qpanel * 64 + 2 * (lane & 3);
#pragma unroll
            for (int n = 0; n < NQ; n++)
              atomicAdd(reinterpret_cast<float2*>(dst + n * 8), make_float2(dq[hf][4 * n + 2 * r], dq[hf][4 * n + 2 * r + 1]));
          }
        }
    } else if constexpr (BT) {
      bulk_stage(h, qt0, nv);
    } else {
#pragma unroll
      for (int hf = 0; hf < NH; hf++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const int qr = hf * 64 + wq * 16 + (lane >> 2) + r * 8;
#pragma unroll
          for (int n = 0; n < NQ; n++)
            *reinterpret_cast<float2*>(stg + qr * SLD + n * 8 + 2 * (lane & 3)) =
                make_float2(dq[hf][4 * n + 2 * r], dq[hf][4 * n + 2 * r + 1]);
        }
      if (dq_variant == 2) fence_async_smem();  // the bulk reduce reads the tile through the async proxy
      bar_sync(1 + wg, 128);  // this warpgroup's tile staged
    }
    if (dq_variant == 2) {
      // one bulk reduce-add (TMA engine) per row, issued by one thread a row; they wait for its reads of
      // the staging tile before the next tile's CTA barrier, after which the tile is rewritten
      const int wt = tid & 127;
      if (wt < nv) {
        float* dst = p.dq_acc + ((int64_t(qt0) + wt) * p.H + h) * D + qpanel * 64;
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                     "r"(smem_u32(stg + wt * SLD)), "n"(NQ * 8 * 4)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
    }
    i_cur = i_next, i_next = i_after;
    advance(cur);
  }
  stamp(6);
  auto store_dkv = [&] {  // each thread its own rows: bf16x2 stores, or fp32 adds for a split column
    const int64_t kv_elems = p.n_tokens * p.Hkv * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int kr = kloc + r * 8;
      if (kr >= b.len) continue;
      const int64_t off = ((int64_t(b.t0) + kr) * p.Hkv + g) * D + 2 * (lane & 3);
      if (split) {  // a share of the column: add it up in fp32 (dkv_convert_kernel stores the bf16)
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
        *reinterpret_cast<__nv_bfloat162*>(p.dv + off + n * 8) =
            __floats2bfloat162_rn(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]);
      }
    }
  };
  // p.tma_dkv (deferred dQ, an unsplit whole key block): dK, dV go to shared memory (the free Q
  // and dO stages) under the last dQ product and out by two TMA stores; store_dkv's bf16x2 stores
  // (half a 32-byte sector each) took ~7,500 of the ~10,500 cycles after a CTA's last tile; this
  // end takes ~5,300 (bench/bwd_trace.py). The CTA waits only for the bulk operations to have read
  // shared memory: their writes complete before the kernel does (a TMA store epilogue's rule).
  // Split columns keep their float2 atomics: TMA reduce-adds of fp32 tiles took as long (the L2's
  // reductions bound both; bench/RESULTS.md).
  const bool tma_dkv = DQD && p.tma_dkv && !split && b.len == kBS;
  // this thread's 16 x 16 blocks of a (128 keys, D) accumulator, scaled, as bf16 into the sw128 tile at dst
  auto stage_bf16 = [&](uint32_t dst, const float (&acc)[D / 2], float sc) {
#pragma unroll
    for (int m = 0; m < D / 16; m++) {
      const uint32_t r[4] = {pack_bf16(acc[8 * m] * sc, acc[8 * m + 1] * sc),
                             pack_bf16(acc[8 * m + 2] * sc, acc[8 * m + 3] * sc),
                             pack_bf16(acc[8 * m + 4] * sc, acc[8 * m + 5] * sc),
                             pack_bf16(acc[8 * m + 6] * sc, acc[8 * m + 7] * sc)};
      stsm_x4(dst + sw128<kBS>(skey, 16 * m + 8 * (lane >> 4)), r);
    }
  };
  if (niter > 0 && staged_atomics) add_staged(ph, pqt0, pnv);
  if constexpr (DQD) {
    wg_fence();
    dq_product();
    if (tma_dkv) {
      stage_bf16(sQ, dk, p.scale);  // dK tile over the Q stages
      stage_bf16(sdO, dv, 1.f);     // dV over the dO stages
    }
    wg_wait<0>();
#pragma unroll
    for (int hf = 0; hf < NH; hf++) reg_fence(dq[hf]);
    if (niter > 0) bulk_stage(ph, pqt0, pnv);
  }
  if (tma_dkv) {
    fence_async_smem();  // the TMA stores read the tiles through the async proxy
    __syncthreads();
    if (tid == 0) {
      tma_store_tile<kBS, D>(&maps.dk, sQ, g, b.t0);
      tma_store_tile<kBS, D>(&maps.dv, sdO, g, b.t0);
    }
  }
  stamp(7);
  cp_async_wait<0>();
  if (tma_dkv) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else if (dq_variant == 2 || BT) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  stamp(8);
  if (!tma_dkv) store_dkv();
  if (p.trace) {  // the end: every thread's stores issued
    __syncthreads();
    if (trace) {
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      stamp(9);
      trace[1] = globaltimer();
      trace[2] = smid;
      trace[3] = unsigned(niter);
    }
  }
#else
  __trap();  // built without sm_90a: use_sm90() keeps this kernel from being launched
#endif
}

template <int D, bool KS, int QT, bool BT = false, bool DQD = false>
void launch(const BwdParams& p, int64_t n_tokens, const BwdCompact& c, cudaStream_t stream) {
  constexpr size_t smem = Tiling<D, KS, QT>::smem;
  SB_CUDA_CHECK(cudaFuncSetAttribute(bwd_sm90_kernel<D, KS, QT, BT, DQD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // dK, dV by TMA stores where their bases allow a tensor map (16-byte aligned)
  BwdParams pp = p;
  pp.tma_dkv = p.tma_dkv && reinterpret_cast<uintptr_t>(p.dk) % 16 == 0 && reinterpret_cast<uintptr_t>(p.dv) % 16 == 0;
  const CUtensorMap mk = tile_map(p.k, n_tokens, p.Hkv, D, kBS), mv = tile_map(p.v, n_tokens, p.Hkv, D, kBS);
  const BwdMaps maps{tile_map(p.q, n_tokens, p.H, D, QT), tile_map(p.dout, n_tokens, p.H, D, QT), mk, mv,
                     pp.tma_dkv ? tile_map(p.dk, n_tokens, p.Hkv, D, kBS) : mk,
                     pp.tma_dkv ? tile_map(p.dv, n_tokens, p.Hkv, D, kBS) : mv};
  const int64_t grid = c.on ? compact_pieces(pp, QT, c.kept, c.scratch, c.bytes, stream) : int64_t(p.n_items) * p.n_split;
  bwd_sm90_kernel<D, KS, QT, BT, DQD><<<unsigned(grid), kThreads, smem, stream>>>(pp, maps);
  SB_CUDA_CHECK_LAUNCH("bwd_sm90_kernel");
}
}  // namespace

bool launch_bwd_sm90(const BwdParams& p, int head_dim, int64_t n_tokens, const BwdCompact& compact,
                     cudaStream_t stream) {
  if (head_dim != 64 && head_dim != 128) throw Error("cuda::launch_bwd_sm90: head_dim must be 64 or 128");
  // The default: dQ by one bulk reduce-add a staged tile, into the tiled workspace (returns true).
  // head_dim 128 splits dQ by columns (the key split there was 1.26x slower), head_dim 64 takes
  // 128-query tiles with dQ split by queries (0.72x the time of 64-query tiles at the Qwen2.5-0.5B
  // shape); dQ deferred to the next tile (DQD); bench/RESULTS.md. SB_ATTN_BWD_VARIANT: 9 the same
  // kernel without the head split (column_split); 8 the same tiles with dQ staged right after its
  // product; 7 with float4 atomics (the default before 8); at head_dim 64, 6 128-query tiles with
  // the key split, 1, 2 and 5 64 queries (1, 2: their dQ accumulation; 5: the float4 atomics); at
  // 128, 1 and 2 their dQ accumulation.
  const bool deferred = p.variant == 0 || p.variant == 9;  // the default kernel
  const bool tiled = deferred || p.variant == 8;
  if (head_dim == 128 && deferred) launch<128, false, 64, true, true>(p, n_tokens, compact, stream);
  else if (head_dim == 128 && tiled) launch<128, false, 64, true>(p, n_tokens, compact, stream);
  else if (head_dim == 128) launch<128, false, 64>(p, n_tokens, compact, stream);
  else if (deferred) launch<64, false, 128, true, true>(p, n_tokens, compact, stream);
  else if (tiled) launch<64, false, 128, true>(p, n_tokens, compact, stream);
  else if (p.variant == 7) launch<64, false, 128>(p, n_tokens, compact, stream);
  else if (p.variant == 6) launch<64, true, 128>(p, n_tokens, compact, stream);
  else launch<64, true, 64>(p, n_tokens, compact, stream);
  return tiled;
}

}  // namespace sb::kernels::cuda
