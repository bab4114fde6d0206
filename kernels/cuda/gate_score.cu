// The per-token query's score stage (GatingParams::query = max) on the GPU, the twin of
// kernels::gate_token_scores (kernels/cpu/gating.cpp, TokenScorer). For every (doc, kv head g, query
// block i, key block j <= i):
//   score = max over block i's query vectors v (its tokens x the group's H/Hkv heads) and block j's
//           key rows r of dot(q_v, k_jr) in fp32
// each dot one thread's sequential sum over d ascending of __fmul_rn products added by __fadd_rn (no
// FMA; bounds: __fadd_rn of fmaxf(q hi, q lo)), q from bf16 (exact), the double key summaries of
// pool_kernel rounded to float: the CPU's bits exactly. The row kernel (gating_kernels.cuh) reads
// these scores instead of scoring, then ranks as in the mean mode.
//
// token_score_kernel: one CTA per (tile, kv head); a tile is kSC = 64 key columns (c = j Rc + r,
// Rc = R key rows a block, bounds: 1 column of two rows) of one query block, listed on the host
// (score_tiles), so no CTA is idle. 256 threads as 16 x 16, each a 4 x 4 register micro-tile of
// (vector, column) dots:
//   shared   ks (D, kSC+4) fp32: the tile's key columns, transposed, loaded once (bounds: hi, lo)
//            qs (kSD, kSV+4) fp32: kSV = 64 query vectors x kSD = 32 dimensions, from bf16
//   loop     per vector tile, per kSD dims: 2 (bounds 3) float4 loads a dimension for 16 products
//            and 16 adds; after the vector tile each thread's column maxima over its valid vectors.
//            A warp holds 8 columns: the warps whose columns all lie past block i skip the products
//            (a query block's last tile is on average half past the diagonal)
//   end      the 16 row threads' maxima of a column in shared memory; one atomicMax a column on
//            the pair's score, kept as an order-preserving uint32 (a key block's rows may fall in
//            two tiles; max is exact, so the order of the atomics does not matter)
// Cost: pairs x (tokens G) x R x D x 2 flops in fp32 on the CUDA cores (no tensor cores: their
// sums are not the CPU's); the 0.47B model at 16K: ~2.7 GFLOP a layer and micro-batch, ~130 a step
// (kernels/README.md, "The per-token score stage", has the expected time).
#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/gate_score.cuh"

namespace sb::kernels::cuda::gating {
namespace {

constexpr int kSV = 64, kSC = 64, kSD = 32, kThreads = 256, kPad = 4;

struct ScoreParams {
  const bf16* q;             // (N, H, D)
  const double* kbar;        // (n_blocks, Hkv, R, D): pool_kernel's key summaries
  const BlockInfo* blocks;   // (n_blocks)
  const int32_t* block_base;  // (ndocs): a doc's first block
  const int64_t* pair_base;   // (ndocs + 1): a doc's first score (pair_bases)
  const ScoreTile* tiles;     // (gridDim.x)
  int H, Hkv, D, R, bounds;
  uint32_t* score;            // (pairs): score_key of the max
};

size_t score_smem_bytes(int D, bool bounds) {
  return (size_t(bounds ? 2 : 1) * D * (kSC + kPad) + size_t(kSD) * (kSV + kPad)) * sizeof(float);
}

__global__ void __launch_bounds__(kThreads) token_score_kernel(const ScoreParams p) {
  extern __shared__ float4 smem4[];  // score_smem_bytes
  float* sm = reinterpret_cast<float*>(smem4);
  const ScoreTile tile = p.tiles[blockIdx.x];
  const int g = blockIdx.y;
  const BlockInfo b = p.blocks[tile.block];
  const int D = p.D, G = p.H / p.Hkv, nv = b.len * G, Rc = p.bounds ? 1 : p.R, ncol = (b.i + 1) * Rc;
  constexpr int KS = kSC + kPad, QS = kSV + kPad;
  float* ks_hi = sm;                                    // (D, KS)
  float* ks_lo = ks_hi + size_t(D) * KS;                // (D, KS), bounds only
  float* qs = ks_hi + size_t(p.bounds ? 2 : 1) * D * KS;  // (kSD, QS)
  const int base = p.block_base[b.doc];
  for (int e = threadIdx.x; e < kSC * D; e += kThreads) {  // key columns, d fastest (coalesced reads)
    const int c = e / D, d = e % D, cc = tile.c0 + c;
    float hi = 0.f, lo = 0.f;
    if (cc < ncol) {
      const double* kj = p.kbar + (size_t(base + cc / Rc) * p.Hkv + g) * p.R * D;
      hi = __double2float_rn(kj[size_t(cc % Rc) * D + d]);
      if (p.bounds) lo = __double2float_rn(kj[D + d]);
    }
    ks_hi[d * KS + c] = hi;
    if (p.bounds) ks_lo[d * KS + c] = lo;
  }
  // columns tx*4.., vectors ty*4..: a warp's 32 threads take 8 columns (all 64 vectors), so a warp
  // whose columns are all past the diagonal (the query block's last tile) skips the products
  const int tx = threadIdx.x / 16, ty = threadIdx.x % 16;
  const bool live = tile.c0 + (threadIdx.x / 32) * 8 < ncol;  // uniform over the warp
  // vector v of the block: token v / G, head g G + v % G
  const bf16* qb = p.q + (int64_t(b.t0) * p.H + int64_t(g) * G) * D;
  float best[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  for (int v0 = 0; v0 < nv; v0 += kSV) {
    float acc[4][4] = {};
    for (int d0 = 0; d0 < D; d0 += kSD) {
      const int dn = min(kSD, D - d0);
      __syncthreads();  // ks written; the previous stage's qs read
      for (int e = threadIdx.x; e < kSV * kSD; e += kThreads) {
        const int v = e / kSD, d = e % kSD, vv = v0 + v;
        qs[d * QS + v] = vv < nv && d < dn ? __bfloat162float(qb[int64_t(vv / G) * p.H * D + (vv % G) * D + d0 + d]) : 0.f;
      }
      __syncthreads();
      if (!live) continue;
#pragma unroll 4
      for (int d = 0; d < dn; d++) {
        const float4 a4 = *reinterpret_cast<const float4*>(qs + d * QS + ty * 4);
        const float4 h4 = *reinterpret_cast<const float4*>(ks_hi + (d0 + d) * KS + tx * 4);
        const float a[4] = {a4.x, a4.y, a4.z, a4.w}, h[4] = {h4.x, h4.y, h4.z, h4.w};
        if (p.bounds) {
          const float4 l4 = *reinterpret_cast<const float4*>(ks_lo + (d0 + d) * KS + tx * 4);
          const float l[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
          for (int x = 0; x < 4; x++)
#pragma unroll
            for (int y = 0; y < 4; y++) acc[x][y] = __fadd_rn(acc[x][y], fmaxf(__fmul_rn(a[x], h[y]), __fmul_rn(a[x], l[y])));
        } else {
#pragma unroll
          for (int x = 0; x < 4; x++)
#pragma unroll
            for (int y = 0; y < 4; y++) acc[x][y] = __fadd_rn(acc[x][y], __fmul_rn(a[x], h[y]));
        }
      }
    }
#pragma unroll
    for (int x = 0; x < 4; x++)
      if (v0 + ty * 4 + x < nv)
#pragma unroll
        for (int y = 0; y < 4; y++) best[y] = fmaxf(best[y], acc[x][y]);
  }
  __syncthreads();  // qs is reused: red (16, kSC)
  float* red = qs;
#pragma unroll
  for (int y = 0; y < 4; y++) red[ty * kSC + tx * 4 + y] = best[y];
  __syncthreads();
  const int cc = tile.c0 + threadIdx.x;
  if (threadIdx.x < kSC && cc < ncol) {
    float m = red[threadIdx.x];
    for (int t = 1; t < 16; t++) m = fmaxf(m, red[t * kSC + threadIdx.x]);
    const int64_t nb = b.nb, i = b.i;
    const int64_t pair = p.pair_base[b.doc] + g * (nb * (nb + 1) / 2) + i * (i + 1) / 2 + cc / Rc;
    atomicMax(p.score + pair, score_key(m));
  }
}

}  // namespace

std::vector<int64_t> pair_bases(const std::vector<int32_t>& block_base, int Hkv) {
  std::vector<int64_t> pb(block_base.size(), 0);
  for (size_t d = 0; d + 1 < block_base.size(); d++) {
    const int64_t nb = block_base[d + 1] - block_base[d];
    pb[d + 1] = pb[d] + Hkv * (nb * (nb + 1) / 2);
  }
  return pb;
}

std::vector<ScoreTile> score_tiles(const std::vector<BlockInfo>& blocks, int R, bool bounds) {
  const int Rc = bounds ? 1 : R;
  std::vector<ScoreTile> t;
  for (size_t bi = 0; bi < blocks.size(); bi++)
    for (int c0 = 0; c0 < (blocks[bi].i + 1) * Rc; c0 += kSC) t.push_back({int32_t(bi), c0});
  return t;
}

void token_scores(const bf16* q, const double* kbar, const BlockInfo* blocks, const int32_t* block_base,
                  const int64_t* pair_base, const ScoreTile* tiles, int n_tiles, int64_t n_pairs, int H, int Hkv,
                  int D, int R, bool bounds, uint32_t* score, cudaStream_t stream) {
  // 0 is below every finite score's key; each pair gets at least one column
  SB_CUDA_CHECK(cudaMemsetAsync(score, 0, size_t(n_pairs) * sizeof(uint32_t), stream));
  if (n_tiles == 0) return;
  const size_t smem = score_smem_bytes(D, bounds);
  if (smem > 48 * 1024)
    SB_CUDA_CHECK(cudaFuncSetAttribute(token_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const ScoreParams p{q, kbar, blocks, block_base, pair_base, tiles, H, Hkv, D, R, int(bounds), score};
  token_score_kernel<<<dim3(unsigned(n_tiles), unsigned(Hkv)), kThreads, smem, stream>>>(p);
  SB_CUDA_CHECK_LAUNCH("token_score_kernel");
}

}  // namespace sb::kernels::cuda::gating
