// Block-sparse attention forward with Hopper warpgroup MMA (sm_90a), block size 128: one CTA per
// (query block, query head) of two consumer warpgroups and one producer warpgroup; consumer w owns
// query rows 64w..64w+63. Each kept key block (128 keys) is one tile. One producer thread streams K
// and V by TMA into three shared-memory stages each (128-byte swizzle), each load completing a "full"
// mbarrier; the consumers release a stage on its "empty" mbarrier once their wgmma read it, so no
// CTA-wide barrier runs in the loop. S = Q K^T by wgmma with both operands in shared memory, online
// softmax in registers, O += P V by wgmma with P straight from registers; the softmax of one tile
// overlaps the P V product of the previous one, and the two warpgroups take turns issuing their
// products (named barriers), so one's softmax runs under the other's matrix products (ping-pong).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tma.hpp"
#include "kernels/cuda/wgmma.cuh"

namespace sb::kernels::cuda {
namespace {
using namespace dev;

constexpr int kBS = 128, kStages = 3;  // K/V tiles in flight or in use
constexpr int kThreads = 384;          // two consumer warpgroups, one producer warpgroup (one thread works)

template <int D>
__global__ void __launch_bounds__(kThreads, 1) fwd_sm90_kernel(const FwdParams p, const __grid_constant__ FwdMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int TILE = kBS * D * 2, DN = D / 8;  // bytes of a 128-row tile; n8 chunks of O
  constexpr int kTurn0 = 1;  // named barriers kTurn0 + w: warpgroup w may issue its products (here: the
                             // host pass, without the sm_90a body, would warn it unused)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + TILE, sV = sK + kStages * TILE;  // K, V: kStages buffers each
  // mbarriers: Q; K full, V full, K empty, V empty (kStages each)
  const uint32_t bars = sV + kStages * TILE;
  auto fullK = [&](int t) { return bars + 8 * (1 + t % kStages); };
  auto fullV = [&](int t) { return bars + 8 * (1 + kStages + t % kStages); };
  auto emptyK = [&](int t) { return bars + 8 * (1 + 2 * kStages + t % kStages); };
  auto emptyV = [&](int t) { return bars + 8 * (1 + 3 * kStages + t % kStages); };
  auto parity = [](int t) { return uint32_t(t / kStages) & 1u; };  // phase of tile t's stage

  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  const WorkItem w = fwd_item(p);
  const BlockInfo b = w.b;
  const int h = w.head, g = w.g;
  const int64_t c0 = w.lo;
  const int niter = w.n;

  if (tid == 0) {
    for (int x = 0; x < 1 + 2 * kStages; x++) mbar_init(bars + 8 * x, 1);
    for (int x = 1 + 2 * kStages; x < 1 + 4 * kStages; x++) mbar_init(bars + 8 * x, 8);  // one per consumer warp
    mbar_init_fence();
  }
  __syncthreads();

  // Producer: Q, then K one tile ahead of V (P V runs one tile behind Q K^T), each into a stage that
  // the consumers released. Rows past the document are the next document's (or zeros past the
  // tensor): queries there are not written, keys there are causally masked for every query.
  if (wg == 2) {
    // The producer needs few registers: give them to the consumers (24 + 2 x 240 per 128 threads).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 256 && niter > 0) {
      mbar_expect(bars, TILE);
      tma_tile<kBS, D>(sQ, &maps.q, bars, h, b.t0);
      for (int t = 0; t <= niter; t++) {
        if (t < niter) {
          if (t >= kStages) mbar_wait(emptyK(t), parity(t) ^ 1u);
          mbar_expect(fullK(t), TILE);
          tma_tile<kBS, D>(sK + (t % kStages) * TILE, &maps.k, fullK(t), g, b.doc_t0 + p.cols[c0 + t] * kBS);
        }
        if (const int v = t - 1; v >= 0) {
          if (v >= kStages) mbar_wait(emptyV(v), parity(v) ^ 1u);
          mbar_expect(fullV(v), TILE);
          tma_tile<kBS, D>(sV + (v % kStages) * TILE, &maps.v, fullV(v), g, b.doc_t0 + p.cols[c0 + v] * kBS);
        }
      }
    }
    return;  // no CTA-wide barrier follows
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  float o[D / 2];  // (64 rows of this warpgroup, D): rows 16wq + lane/4 (+8)
#pragma unroll
  for (int n = 0; n < D / 2; n++) o[n] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int qpos0 = b.i * kBS + wg * 64 + wq * 16 + (lane >> 2);  // query position in the doc
  float s[64];         // S of the current tile: (64 queries, 128 keys)
  uint32_t pa[8][4];   // P of the previous tile as bf16 A fragments (16 keys each)
  float corr[2];

  // mask (diagonal block only), online softmax of s in place: the max over the raw scores, then
  // exp2(s * scale_log2 - m) as one FFMA + EX2 per element (m, l in the log2 domain); corr = rescale
  // of the older terms. Few instructions per element matter: the kernel is issue-bound.
  auto softmax = [&](int it) {
    if (p.cols[c0 + it] == b.i) {
      const int kpos0 = b.i * kBS + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < 16; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          if (kpos0 + n * 8 + (e & 1) > qpos0 + (e >> 1) * 8) s[4 * n + e] = -INFINITY;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 16; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m[r], mx * p.scale_log2);
      const float shift = mnew == -INFINITY ? 0.f : mnew;
      corr[r] = ex2(m[r] - shift);
      m[r] = mnew;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 16; n++) {
        s[4 * n + 2 * r] = ex2(fmaf(s[4 * n + 2 * r], p.scale_log2, -shift));
        s[4 * n + 2 * r + 1] = ex2(fmaf(s[4 * n + 2 * r + 1], p.scale_log2, -shift));
        sum += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
      }
      l[r] = l[r] * corr[r] + sum;
    }
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
#pragma unroll
      for (int e = 0; e < 4; e++) pa[kk][e] = pack_bf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  };
  auto qk = [&](uint32_t tK) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
      wgmma_ss_n128<0, 0>(s, desc_k<kBS>(sQ, wg * 64, kk * 16), desc_k<kBS>(tK, 0, kk * 16), kk > 0);
    wg_commit();
  };
  auto pv = [&](uint32_t tV) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) wgmma_rs<1>(o, pa[kk], desc_mn<kBS>(tV, kk * 16, 0));
    wg_commit();
  };
  // Ping-pong: warpgroup w issues its products after the other one issued its own (named barrier
  // kTurn0 + w), then lets the other go. Warpgroup 1 lets warpgroup 0 go first and skips its last
  // hand-over, so every barrier sees as many arrivals as waits.
  const int my_turn = kTurn0 + wg, other_turn = kTurn0 + (wg ^ 1);
  auto release = [&](uint32_t bar) {  // this warp is done reading a stage (its wgmma completed)
    if (lane == 0) mbar_arrive(bar);
  };

  if (niter > 0) {
    if (wg == 1) bar_arrive(other_turn, 256);
    mbar_wait(bars, 0);  // Q
    mbar_wait(fullK(0), 0);
    bar_sync(my_turn, 256);
    wg_fence();
    qk(sK);
    bar_arrive(other_turn, 256);
    wg_wait<0>();
    reg_fence(s);
    release(emptyK(0));
    softmax(0);  // o is still 0: nothing to rescale
    pack_p();
  }
  // Iteration it: S_it = Q K_it^T and O += P_{it-1} V_{it-1} in flight together; the softmax of S_it
  // runs while the tensor cores finish P V and the other warpgroup's products.
  for (int it = 1; it < niter; it++) {
    mbar_wait(fullK(it), parity(it));
    mbar_wait(fullV(it - 1), parity(it - 1));
    bar_sync(my_turn, 256);
    wg_fence();
    qk(sK + (it % kStages) * TILE);
    pv(sV + ((it - 1) % kStages) * TILE);
    bar_arrive(other_turn, 256);
    wg_wait<1>();
    reg_fence(s);
    release(emptyK(it));
    softmax(it);
    wg_wait<0>();
    reg_fence(o);
#pragma unroll
    for (int kk = 0; kk < 8; kk++) reg_fence(pa[kk]);
    release(emptyV(it - 1));
#pragma unroll
    for (int n = 0; n < DN; n++) {
      o[4 * n] *= corr[0];
      o[4 * n + 1] *= corr[0];
      o[4 * n + 2] *= corr[1];
      o[4 * n + 3] *= corr[1];
    }
    pack_p();
  }
  if (niter > 0) {
    mbar_wait(fullV(niter - 1), parity(niter - 1));
    bar_sync(my_turn, 256);
    wg_fence();
    pv(sV + ((niter - 1) % kStages) * TILE);
    if (wg == 0) bar_arrive(other_turn, 256);
    wg_wait<0>();
    reg_fence(o);
#pragma unroll
    for (int kk = 0; kk < 8; kk++) reg_fence(pa[kk]);
  }

  fwd_store<D>(p, b, h, wg * 64 + wq * 16 + (lane >> 2), lane, l, m, [&](int n, int e) { return o[4 * n + e]; });
#else
  __trap();  // built without sm_90a: use_sm90() keeps this kernel from being launched
#endif
}

template <int D>
void launch(const FwdParams& p, int n_blocks, int64_t n_tokens, cudaStream_t stream) {
  // Q, K and V stages, mbarriers (Q; full and empty of each stage), alignment slack
  constexpr size_t smem = size_t(1 + 2 * kStages) * kBS * D * 2 + 8 * (1 + 4 * kStages) + 1024;
  SB_CUDA_CHECK(cudaFuncSetAttribute(fwd_sm90_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const FwdMaps maps{tile_map(p.q, n_tokens, p.H, D, kBS), tile_map(p.k, n_tokens, p.Hkv, D, kBS),
                     tile_map(p.v, n_tokens, p.Hkv, D, kBS)};
  fwd_sm90_kernel<D><<<n_blocks * p.H, kThreads, smem, stream>>>(p, maps);
  SB_CUDA_CHECK_LAUNCH("fwd_sm90_kernel");
}
}  // namespace

namespace {
std::atomic<bool> g_prefer{true};  // prefer_wgmma_attention
}  // namespace

bool wgmma_attention_available() {
#if defined(SB_WGMMA)
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    SB_CUDA_CHECK(cudaGetDevice(&dev));
    SB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    SB_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
  }();
  return ok;
#else
  return false;
#endif
}

void prefer_wgmma_attention(bool on) { g_prefer = on; }

bool use_sm90(int block_size) {
  return g_prefer && block_size == kBS && wgmma_attention_available();
}

int dense_block_size(AttnShape s) {
  return (s.head_dim == 64 || s.head_dim == 128) && use_sm90(kBS) ? kBS : s.block_size;
}

void launch_fwd_sm90(const FwdParams& p, int head_dim, int n_blocks, int64_t n_tokens, cudaStream_t stream) {
  if (head_dim == 128) launch<128>(p, n_blocks, n_tokens, stream);
  else if (head_dim == 64) launch<64>(p, n_blocks, n_tokens, stream);
  else throw Error("cuda::launch_fwd_sm90: head_dim must be 64 or 128");
}

}  // namespace sb::kernels::cuda
