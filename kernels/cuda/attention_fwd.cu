// Block-sparse attention forward on the GPU: one CTA per (query block, query head), BS/16 warps of
// 16 query rows each; the kept key blocks of the row are walked in 64-key tiles, K/V double-buffered
// with cp.async, S = Q K^T and O += P V on the tensor cores (mma.sync bf16, fp32 accumulate), online
// softmax in registers (log2 domain).
#include <cmath>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mma.cuh"

namespace sb::kernels::cuda {
namespace {
using namespace dev;

template <int D, int BS>
__global__ void __launch_bounds__(BS / 16 * 32) fwd_kernel(const FwdParams p) {
  constexpr int NW = BS / 16, NT = NW * 32, KT = 64, NSUB = BS / KT, DK = D / 16, DN = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + BS * D;   // 2 buffers of KT x D
  bf16* sV = sK + 2 * KT * D;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const WorkItem w = fwd_item(p);
  const BlockInfo b = w.b;
  const int h = w.head, g = w.g;
  const int64_t c0 = w.lo;
  const int niter = w.n * NSUB;
  const int doc_end = b.doc_t0 + b.doc_len;
  const int64_t ldq = int64_t(p.H) * D, ldk = int64_t(p.Hkv) * D;

  load_tile<BS, D, NT>(sQ, p.q + (int64_t(b.t0) * p.H + h) * D, ldq, b.len, tid);
  cp_async_commit();
  auto issue = [&](int it) {
    const int c = it / NSUB, sub = it % NSUB, buf = it & 1;
    const int j = p.cols[c0 + c];
    const int u0 = b.doc_t0 + j * BS + sub * KT;
    const int nvalid = min(KT, doc_end - u0);
    const int64_t off = (int64_t(u0) * p.Hkv + g) * D;
    load_tile<KT, D, NT>(sK + buf * KT * D, p.k + off, ldk, nvalid, tid);
    load_tile<KT, D, NT>(sV + buf * KT * D, p.v + off, ldk, nvalid, tid);
  };
  if (niter > 0) issue(0);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  uint32_t qf[DK][4];
#pragma unroll
  for (int kk = 0; kk < DK; kk++) lds_a<D>(qf[kk], sQ, warp * 16, kk * 16, lane);

  float o[DN][4];
#pragma unroll
  for (int n = 0; n < DN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int qpos0 = b.i * BS + warp * 16 + (lane >> 2);  // query position in the doc (row g; +8)

  for (int it = 0; it < niter; it++) {
    if (it + 1 < niter) issue(it + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int buf = it & 1;
    const bf16* tK = sK + buf * KT * D;
    const bf16* tV = sV + buf * KT * D;
    float s[KT / 8][4];
#pragma unroll
    for (int n = 0; n < KT / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DK; kk++) {
#pragma unroll
      for (int np = 0; np < KT / 16; np++) {
        uint32_t kb[4];
        lds_b_nk<D>(kb, tK, np * 16, kk * 16, lane);
        mma16816(s[2 * np], qf[kk], kb[0], kb[1]);
        mma16816(s[2 * np + 1], qf[kk], kb[2], kb[3]);
      }
    }
    const int c = it / NSUB, sub = it % NSUB;
    const int j = p.cols[c0 + c];
    const bool diag = (j == b.i);
    const int kpos0 = j * BS + sub * KT + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < KT / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[n][e] * p.scale_log2;
        if (diag) {
          const int kp = kpos0 + n * 8 + (e & 1), qp = qpos0 + (e >> 1) * 8;
          if (kp > qp) x = -INFINITY;
        }
        s[n][e] = x;
      }
    // online softmax, rows r = 0 (g) and 1 (g + 8)
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = m[r];
#pragma unroll
      for (int n = 0; n < KT / 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float shift = mx == -INFINITY ? 0.f : mx;
      corr[r] = ex2(m[r] - shift);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < KT / 8; n++) {
        s[n][2 * r] = ex2(s[n][2 * r] - shift);
        s[n][2 * r + 1] = ex2(s[n][2 * r + 1] - shift);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * corr[r] + sum;
    }
#pragma unroll
    for (int n = 0; n < DN; n++) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++) {
      uint32_t a[4];
      a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      mma_a_kn<D>(o, a, tV, kk * 16, lane);
    }
    __syncthreads();  // the next issue overwrites this buffer
  }

  fwd_store<D>(p, b, h, warp * 16 + (lane >> 2), lane, l, m, [&](int n, int e) { return o[n][e]; });
}

template <int D, int BS>
void launch_fwd(const FwdParams& p, int n_blocks, cudaStream_t stream) {
  constexpr int NT = BS / 16 * 32;
  constexpr size_t smem = size_t(BS * D + 4 * 64 * D) * sizeof(bf16);
  SB_CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<D, BS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  fwd_kernel<D, BS><<<n_blocks * p.H, NT, smem, stream>>>(p);
  SB_CUDA_CHECK_LAUNCH("fwd_kernel");
}
}  // namespace

void block_attention_fwd(const bf16* q, const bf16* k, const bf16* v, const DeviceSelection& sel, AttnShape s,
                         bf16* out, float* lse, cudaStream_t stream) {
  if (sel.n_blocks == 0) return;
  if (sel.block_size != s.block_size || sel.n_kv_heads != s.n_kv_heads || sel.n_heads != s.n_heads ||
      s.n_heads % s.n_kv_heads != 0)
    throw Error("cuda::block_attention_fwd: selection does not match the attention shape");
  FwdParams p{q, k, v, out, lse, sel.blocks, sel.row_base, sel.row_ptr, sel.cols, s.n_heads, s.n_kv_heads,
              float(1.4426950408889634 / std::sqrt(double(s.head_dim))), sel.fwd_items};
  if (use_sm90(s.block_size) && (s.head_dim == 64 || s.head_dim == 128)) launch_fwd_sm90(p, s.head_dim, sel.n_blocks, sel.n_tokens, stream);
  else if (s.head_dim == 64 && s.block_size == 64) launch_fwd<64, 64>(p, sel.n_blocks, stream);
  else if (s.head_dim == 64 && s.block_size == 128) launch_fwd<64, 128>(p, sel.n_blocks, stream);
  else if (s.head_dim == 128 && s.block_size == 64) launch_fwd<128, 64>(p, sel.n_blocks, stream);
  else if (s.head_dim == 128 && s.block_size == 128) launch_fwd<128, 128>(p, sel.n_blocks, stream);
  else throw Error("cuda::block_attention_fwd: head_dim must be 64 or 128, block_size 64 or 128");
}

}  // namespace sb::kernels::cuda
