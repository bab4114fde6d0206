// Block-sparse attention forward with Hopper warpgroup MMA (sm_90a), block size 128: one CTA of two
// warpgroups per (query block, query head); warpgroup w owns query rows 64w..64w+63. Each kept key
// block (128 keys) is one tile: K and V in three shared-memory stages (cp.async, 128-byte swizzle),
// S = Q K^T by wgmma with both operands in shared memory, online softmax in registers, O += P V by
// wgmma with P straight from registers (no round trip through shared memory); the softmax of one
// tile overlaps the P V product of the previous one.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace sb::kernels::cuda {
namespace {
using namespace dev;

constexpr int kBS = 128, kThreads = 256, kStages = 3;  // K/V tiles in flight or in use

template <int D>
__global__ void __launch_bounds__(kThreads, 1) fwd_sm90_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int TILE = kBS * D * 2, DN = D / 8;  // bytes of a 128-row tile; n8 chunks of O
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + TILE, sV = sK + kStages * TILE;  // K, V: kStages buffers each

  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  const BlockInfo b = p.blocks[blockIdx.x];
  const int h = blockIdx.y, G = p.H / p.Hkv, g = h / G;
  const int64_t row = p.row_base[b.doc] + int64_t(g) * b.nb + b.i;
  const int64_t c0 = p.row_ptr[row];
  const int niter = int(p.row_ptr[row + 1] - c0);
  const int doc_end = b.doc_t0 + b.doc_len;
  const int64_t ldq = int64_t(p.H) * D, ldk = int64_t(p.Hkv) * D;

  // One commit group per tile (empty past the end), so "tile it has landed" is always wait_group<1>
  // at the top of iteration it: only tile it + 1 may still be in flight.
  auto issue = [&](int it) {
    if (it < niter) {
      const int j = p.cols[c0 + it], buf = it % kStages;
      const int u0 = b.doc_t0 + j * kBS;
      const int64_t off = (int64_t(u0) * p.Hkv + g) * D;
      const int nvalid = min(kBS, doc_end - u0);
      load_sw128<kBS, D, kThreads>(sK + buf * TILE, p.k + off, ldk, nvalid, tid);
      load_sw128<kBS, D, kThreads>(sV + buf * TILE, p.v + off, ldk, nvalid, tid);
    }
    cp_async_commit();
  };
  load_sw128<kBS, D, kThreads>(sQ, p.q + (int64_t(b.t0) * p.H + h) * D, ldq, b.len, tid);
  issue(0);  // with Q
  issue(1);

  float o[D / 2];  // (64 rows of this warpgroup, D): rows 16wq + lane/4 (+8)
#pragma unroll
  for (int n = 0; n < D / 2; n++) o[n] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int qpos0 = b.i * kBS + wg * 64 + wq * 16 + (lane >> 2);  // query position in the doc
  float s[64];         // S of the current tile: (64 queries, 128 keys)
  uint32_t pa[8][4];   // P of the previous tile as bf16 A fragments (16 keys each)
  float corr[2];

  // mask (diagonal block), online softmax of s in place (log2 domain), corr = rescale of older terms
  auto softmax = [&](int it) {
    const int j = p.cols[c0 + it];
    const bool diag = (j == b.i);
    const int kpos0 = j * kBS + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < 16; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[4 * n + e] * p.scale_log2;
        if (diag && kpos0 + n * 8 + (e & 1) > qpos0 + (e >> 1) * 8) x = -INFINITY;
        s[4 * n + e] = x;
      }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = m[r];
#pragma unroll
      for (int n = 0; n < 16; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float shift = mx == -INFINITY ? 0.f : mx;
      corr[r] = ex2(m[r] - shift);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 16; n++) {
        s[4 * n + 2 * r] = ex2(s[4 * n + 2 * r] - shift);
        s[4 * n + 2 * r + 1] = ex2(s[4 * n + 2 * r + 1] - shift);
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

  if (niter > 0) {
    cp_async_wait<1>();
    fence_async_smem();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    __syncthreads();
    wg_fence();
    qk(sK);
    wg_wait<0>();
    reg_fence(s);
    softmax(0);  // o is still 0: nothing to rescale
    pack_p();
    issue(2);    // buffer 2 was never used
  }
  // Iteration it: S_it = Q K_it^T and O += P_{it-1} V_{it-1} in flight together; the softmax of S_it
  // runs while the tensor cores finish P V. Three buffers: tile it + 1 lands meanwhile, it + 2 is
  // loaded into the buffer of it - 1 once every warp is done with it.
  for (int it = 1; it < niter; it++) {
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();
    wg_fence();
    qk(sK + (it % kStages) * TILE);
    pv(sV + ((it - 1) % kStages) * TILE);
    wg_wait<1>();
    reg_fence(s);
    softmax(it);
    wg_wait<0>();
    reg_fence(o);
#pragma unroll
    for (int kk = 0; kk < 8; kk++) reg_fence(pa[kk]);
#pragma unroll
    for (int n = 0; n < DN; n++) {
      o[4 * n] *= corr[0];
      o[4 * n + 1] *= corr[0];
      o[4 * n + 2] *= corr[1];
      o[4 * n + 3] *= corr[1];
    }
    pack_p();
    __syncthreads();  // buffer (it - 1) % kStages is free in every warp
    issue(it + 2);
  }
  if (niter > 0) {
    wg_fence();
    pv(sV + ((niter - 1) % kStages) * TILE);
    wg_wait<0>();
    reg_fence(o);
#pragma unroll
    for (int kk = 0; kk < 8; kk++) reg_fence(pa[kk]);
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int rloc = wg * 64 + wq * 16 + (lane >> 2);
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int rr = rloc + r * 8;
    if (rr >= b.len) continue;
    const int64_t t = b.t0 + rr;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    bf16* orow = p.out + (t * p.H + h) * D + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < DN; n++)
      *reinterpret_cast<__nv_bfloat162*>(orow + n * 8) =
          __floats2bfloat162_rn(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
    if ((lane & 3) == 0)
      p.lse[t * p.H + h] = l[r] > 0.f ? (m[r] + __log2f(l[r])) * 0.69314718055994531f : INFINITY;
  }
#else
  __trap();  // built without sm_90a: use_sm90() keeps this kernel from being launched
#endif
}

template <int D>
void launch(const FwdParams& p, int n_blocks, cudaStream_t stream) {
  constexpr size_t smem = size_t(1 + 2 * kStages) * kBS * D * 2 + 1024;  // Q, K and V stages, alignment slack
  SB_CUDA_CHECK(cudaFuncSetAttribute(fwd_sm90_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  fwd_sm90_kernel<D><<<dim3(n_blocks, p.H), kThreads, smem, stream>>>(p);
  SB_CUDA_CHECK_LAUNCH("fwd_sm90_kernel");
}
}  // namespace

namespace {
std::atomic<int> g_prefer{-1};  // -1: not read yet (SB_ATTN_KERNEL), 0 mma.sync, 1 wgmma
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

void prefer_wgmma_attention(bool on) { g_prefer = on ? 1 : 0; }

bool use_sm90(int block_size) {
  if (g_prefer < 0) {
    const char* e = std::getenv("SB_ATTN_KERNEL");
    g_prefer = (e && std::strcmp(e, "mma") == 0) ? 0 : 1;
  }
  return g_prefer == 1 && block_size == kBS && wgmma_attention_available();
}

void launch_fwd_sm90(const FwdParams& p, int head_dim, int n_blocks, cudaStream_t stream) {
  if (head_dim == 128) launch<128>(p, n_blocks, stream);
  else if (head_dim == 64) launch<64>(p, n_blocks, stream);
  else throw std::runtime_error("cuda::launch_fwd_sm90: head_dim must be 64 or 128");
}

}  // namespace sb::kernels::cuda
