// Block-sparse attention backward on the GPU (FlashAttention-2 scheme): one CTA per (key block,
// kv head), BS/16 warps of 16 keys each, K and V resident in shared memory, dK and dV in registers.
// It walks every query head of the group x every query block that keeps this key block (the
// transposed selection) in 64-query tiles, Q/dO double-buffered with cp.async:
//   S^T = K Q^T, P^T = exp(S^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - Delta),
//   dK += dS^T Q, dQ += dS K (fp32 atomics into a workspace, scaled and rounded to bf16 at the end).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mma.cuh"

namespace sb::kernels::cuda {
namespace {
using namespace dev;

constexpr int QT = 64;  // query tile

// Delta[t, h] = sum_d dO * O (fp32), one warp per (t, h); also zeroes the dq accumulator row and
// writes lse in log2 units (lse * log2(e), for the wgmma kernel's exp2: one multiply a row here
// instead of one per query per CTA that reads it; the mma.sync kernel reads lse).
template <int D>
__global__ void bwd_prep_kernel(const bf16* out, const bf16* dout, const float* lse, float* delta, float* lse2,
                                float* dq_acc, int64_t rows) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  float acc = 0.f;
#pragma unroll
  for (int e = lane * 2; e < D; e += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + r * D + e));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + r * D + e));
    acc += a.x * b.x + a.y * b.y;
    *reinterpret_cast<float2*>(dq_acc + r * D + e) = make_float2(0.f, 0.f);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    delta[r] = acc;
    lse2[r] = lse[r] * 1.4426950408889634f;
  }
}

__global__ void dq_convert_kernel(const float* dq_acc, bf16* dq, float scale, int64_t n2) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n2; i += int64_t(gridDim.x) * blockDim.x) {
    const float2 a = reinterpret_cast<const float2*>(dq_acc)[i];
    reinterpret_cast<__nv_bfloat162*>(dq)[i] = __floats2bfloat162_rn(a.x * scale, a.y * scale);
  }
}

// The same from the tiled workspace (dq_tiled_index): a warp reads one row's 64-float panel.
template <int D>
__global__ void dq_convert_tiled_kernel(const float* dq_acc, bf16* dq, float scale, int64_t n_tokens, int H) {
  const int64_t n2 = n_tokens * H * D / 2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n2; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = 2 * i, t = e / (int64_t(H) * D);
    const int rem = int(e - t * H * D), h = rem / D, d = rem % D;
    const float2 a = *reinterpret_cast<const float2*>(dq_acc + dq_tiled_index(t, h, d, n_tokens, D));
    reinterpret_cast<__nv_bfloat162*>(dq)[i] = __floats2bfloat162_rn(a.x * scale, a.y * scale);
  }
}

// The wgmma backward's split columns (BwdParams::chunk > 0): their dK, dV fp32 sums -> bf16. A
// column that is not split (bwd_column_split, the kernel's own test) was stored by its one CTA, so
// its CTA here leaves at once.
template <int D>
__global__ void dkv_convert_kernel(const BwdParams p) {
  const int bi = int(blockIdx.x) / p.Hkv, g = int(blockIdx.x) % p.Hkv;
  const BlockInfo b = p.blocks[bi];
  const int64_t x = p.row_base[b.doc] + int64_t(g) * b.nb + b.i;
  if (!bwd_column_split(p, p.H / p.Hkv, int(p.col_ptr[x + 1] - p.col_ptr[x]))) return;
  const int64_t kv = p.n_tokens * p.Hkv * D;
  for (int e = 2 * int(threadIdx.x); e < b.len * D; e += 2 * int(blockDim.x)) {
    const int64_t off = ((int64_t(b.t0) + e / D) * p.Hkv + g) * D + e % D;
    const float2 a = *reinterpret_cast<const float2*>(p.dkv_acc + off);
    const float2 c = *reinterpret_cast<const float2*>(p.dkv_acc + kv + off);
    *reinterpret_cast<__nv_bfloat162*>(p.dk + off) = __floats2bfloat162_rn(a.x, a.y);
    *reinterpret_cast<__nv_bfloat162*>(p.dv + off) = __floats2bfloat162_rn(c.x, c.y);
  }
}

template <int D, int BS>
__global__ void __launch_bounds__(BS / 16 * 32, 1) bwd_kernel(const BwdParams p) {
  constexpr int NW = BS / 16, NT = NW * 32, NSUB = BS / QT, DN = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + BS * D;
  bf16* sQ = sV + BS * D;      // 2 buffers of QT x D
  bf16* sdO = sQ + 2 * QT * D;  // 2 buffers
  bf16* sdS = sdO + 2 * QT * D; // BS x QT (dS^T: rows keys, columns queries)
  float* sL = reinterpret_cast<float*>(sdS + BS * QT);  // 2 x QT: lse * log2(e)
  float* sDl = sL + 2 * QT;                             // 2 x QT: Delta

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const WorkItem w = bwd_item(p, int(blockIdx.x));  // one CTA an item (no column split here)
  const BlockInfo b = w.b;  // key block j = b.i
  const int g = w.g, G = p.H / p.Hkv, nq = w.n, doc_end = b.doc_t0 + b.doc_len;
  const int64_t r0 = w.lo;
  const int niter = G * nq * NSUB;
  const int64_t ldq = int64_t(p.H) * D, ldk = int64_t(p.Hkv) * D;

  {
    const int64_t off = (int64_t(b.t0) * p.Hkv + g) * D;
    load_tile<BS, D, NT>(sK, p.k + off, ldk, b.len, tid);
    load_tile<BS, D, NT>(sV, p.v + off, ldk, b.len, tid);
  }
  cp_async_commit();
  // iteration it -> (head hh of the group, query block, sub-tile)
  auto decode = [&](int it, int& h, int& i, int& qt0, int& nvalid) {
    const int sub = it % NSUB, rest = it / NSUB;
    h = g * G + rest / nq;
    i = p.col_rows[r0 + rest % nq];
    qt0 = b.doc_t0 + i * BS + sub * QT;
    nvalid = max(0, min(QT, doc_end - qt0));
  };
  auto issue = [&](int it) {
    int h, i, qt0, nv;
    decode(it, h, i, qt0, nv);
    const int buf = it & 1;
    const int64_t off = (int64_t(qt0) * p.H + h) * D;
    load_tile<QT, D, NT>(sQ + buf * QT * D, p.q + off, ldq, nv, tid);
    load_tile<QT, D, NT>(sdO + buf * QT * D, p.dout + off, ldq, nv, tid);
    for (int r = tid; r < QT; r += NT) {
      const bool ok = r < nv;
      sL[buf * QT + r] = ok ? p.lse[(int64_t(qt0) + r) * p.H + h] * 1.4426950408889634f : INFINITY;
      sDl[buf * QT + r] = ok ? p.delta[(int64_t(qt0) + r) * p.H + h] : 0.f;
    }
  };
  if (niter > 0) issue(0);
  cp_async_commit();

  float dk[DN][4], dv[DN][4];
#pragma unroll
  for (int n = 0; n < DN; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.f;
  const int krow = warp * 16;  // this warp's keys in the block
  const int kpos0 = b.i * BS + krow + (lane >> 2);

  for (int it = 0; it < niter; it++) {
    if (it + 1 < niter) issue(it + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int buf = it & 1;
    const bf16* tQ = sQ + buf * QT * D;
    const bf16* tdO = sdO + buf * QT * D;
    const float* tL = sL + buf * QT;
    const float* tDl = sDl + buf * QT;
    int h, i, qt0, nv;
    decode(it, h, i, qt0, nv);
    const bool diag = (i == b.i);
    const int qpos0 = qt0 - b.doc_t0 + 2 * (lane & 3);

    // S^T = K Q^T (16 keys x QT queries per warp)
    float st[QT / 8][4];
    mma_abt<D, QT>(st, sK, krow, tQ, lane);
    // P^T = exp2(S^T * scale*log2e - lse*log2e), causal on the diagonal block
    uint32_t pt[QT / 16][4];
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
      const int qc = n * 8 + 2 * (lane & 3);
      const float l0 = tL[qc], l1 = tL[qc + 1];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = ex2(st[n][e] * p.scale_log2 - ((e & 1) ? l1 : l0));
        if (diag) {
          const int kp = kpos0 + (e >> 1) * 8, qp = qpos0 + n * 8 + (e & 1);
          if (kp > qp) x = 0.f;
        }
        st[n][e] = x;
      }
    }
#pragma unroll
    for (int kk = 0; kk < QT / 16; kk++) {
      pt[kk][0] = pack_bf16(st[2 * kk][0], st[2 * kk][1]);
      pt[kk][1] = pack_bf16(st[2 * kk][2], st[2 * kk][3]);
      pt[kk][2] = pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]);
      pt[kk][3] = pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3]);
    }
    // dV += P^T dO
#pragma unroll
    for (int kk = 0; kk < QT / 16; kk++) mma_a_kn<D>(dv, pt[kk], tdO, kk * 16, lane);
    // dP^T = V dO^T
    float dpt[QT / 8][4];
    mma_abt<D, QT>(dpt, sV, krow, tdO, lane);
    // dS^T = P^T (dP^T - Delta); to registers (bf16 A fragments) and to shared memory
    uint32_t ds[QT / 16][4];
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
      const int qc = n * 8 + 2 * (lane & 3);
      const float d0 = tDl[qc], d1 = tDl[qc + 1];
      const float x0 = st[n][0] * (dpt[n][0] - d0), x1 = st[n][1] * (dpt[n][1] - d1);
      const float x2 = st[n][2] * (dpt[n][2] - d0), x3 = st[n][3] * (dpt[n][3] - d1);
      const uint32_t lo = pack_bf16(x0, x1), hi = pack_bf16(x2, x3);
      ds[n / 2][(n & 1) * 2 + 0] = lo;
      ds[n / 2][(n & 1) * 2 + 1] = hi;
      const int kr = krow + (lane >> 2);
      *reinterpret_cast<uint32_t*>(sdS + swz<QT>(kr, qc)) = lo;
      *reinterpret_cast<uint32_t*>(sdS + swz<QT>(kr + 8, qc)) = hi;
    }
    // dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < QT / 16; kk++) mma_a_kn<D>(dk, ds[kk], tQ, kk * 16, lane);
    __syncthreads();  // sdS complete
    // dQ (QT x D) += dS K: warp w takes query rows (w % 4) * 16 and a 1/(NW/4) slice of D
    {
      constexpr int WSPLIT = NW / 4, DW = D / WSPLIT, NN = DW / 8;
      const int m0 = (warp & 3) * 16, n0 = (warp >> 2) * DW;
      float acc[NN][4];
#pragma unroll
      for (int n = 0; n < NN; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BS / 16; kk++) {
        uint32_t a[4];
        lds_a_t<QT>(a, sdS, m0, kk * 16, lane);
        mma_a_kn<D, DW>(acc, a, sK, kk * 16, lane, n0);
      }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int qr = m0 + (lane >> 2) + r * 8;
        if (qr < nv) {
          float* dst = p.dq_acc + ((int64_t(qt0) + qr) * p.H + h) * D + n0 + 2 * (lane & 3);
#pragma unroll
          for (int n = 0; n < NN; n++)
            atomicAdd(reinterpret_cast<float2*>(dst + n * 8), make_float2(acc[n][2 * r], acc[n][2 * r + 1]));
        }
      }
    }
    __syncthreads();  // buffers and sdS are reused
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int kr = krow + (lane >> 2) + r * 8;
    if (kr >= b.len) continue;
    const int64_t off = ((int64_t(b.t0) + kr) * p.Hkv + g) * D + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < DN; n++) {
      *reinterpret_cast<__nv_bfloat162*>(p.dk + off + n * 8) =
          __floats2bfloat162_rn(dk[n][2 * r] * p.scale, dk[n][2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(p.dv + off + n * 8) = __floats2bfloat162_rn(dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

template <int D, int BS>
void launch_bwd(const BwdParams& p, int n_blocks, cudaStream_t stream) {
  constexpr int NT = BS / 16 * 32;
  const size_t smem = size_t(2 * BS * D + 4 * QT * D + BS * QT) * sizeof(bf16) + 4 * QT * sizeof(float);
  SB_CUDA_CHECK(cudaFuncSetAttribute(bwd_kernel<D, BS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  bwd_kernel<D, BS><<<n_blocks * p.Hkv, NT, smem, stream>>>(p);
  SB_CUDA_CHECK_LAUNCH("bwd_kernel");
}
}  // namespace

// The column split of the wgmma backward (BwdParams::chunk). One CTA per (key block, kv head) walks
// every query tile that keeps the block; with the always-kept sink block that column holds every
// query block of the document (x the group), 6x a fair share of an SM at 32K, and bounded the whole
// backward (bench/results/2026-12-01-bwd-column-split.md). set_bwd_column_chunk(N): at most N tiles per CTA, 0 never split;
// -1 (the default): the longest possible column (the longest document x the group) in at most 16 chunks, and never
// below 128 tiles a chunk (the K, V loads and the fp32 dK, dV adds stay a few % of a chunk). With
// MHA and the kept blocks known on the host, a column is split only where it could exceed half an
// SM's fair share of the tiles, in chunks of that half: a split costs the fp32 dK, dV adds and
// their zeroing, and with 32 heads (never split this way) the backward took 0.93-0.99x its time
// at 16K-64K (bench/results/2026-12-04-power-cap-mha-splits.md). GQA keeps the 16 chunks: its head split is what keeps the
// group's Q and dO in L2.
namespace {
int g_bwd_chunk = -1;  // set_bwd_column_chunk; -1 automatic
size_t dkv_acc_offset(int64_t n_tokens, AttnShape s) { return attention_bwd_dkv_offset(n_tokens, s); }
void column_split(BwdParams& p, int max_doc_blocks, int block_size, int64_t kept) {
  const int bound = std::max(1, (p.H / p.Hkv) * max_doc_blocks * (block_size / 64));
  if (g_bwd_chunk >= 0) {
    p.chunk = g_bwd_chunk;
  } else if (p.H == p.Hkv && kept > 0) {  // MHA, the kept blocks known
    const int64_t half_share = kept * (block_size / 64) / (2 * int64_t(sm_count()));  // one CTA an SM
    p.chunk = bound <= half_share ? 0 : int(std::max<int64_t>(128, half_share));
  } else {
    p.chunk = std::max(128, (bound + 15) / 16);
  }
  p.n_split = p.chunk > 0 ? std::max(1, (bound + p.chunk - 1) / p.chunk) : 1;
  // The head split: a split column is cut at its query heads first (with GQA) and each head's
  // tiles into chunks, n_split = the group x the chunks of the longest head, and the launch runs in
  // windows of the SMs' items, piece-major (BwdParams::head_split), so that the CTAs running
  // together read one stretch of one head's Q, dO and dQ. Item-major chunks (the order before)
  // read the whole group's, or with MHA one head's whole length, at once: L2 hit rate 67% at 10 / 2
  // heads, 83% with 32 MHA heads at 64K; the head split took 0.79x their backward time at 64K
  // dense, 0.47B shape (bench/results/2026-12-03-gqa-split-by-head.md).
  if (p.chunk > 0) {
    p.head_split = sm_count();
    const int per_head = std::max(1, max_doc_blocks * (block_size / 64));
    p.n_split = (p.H / p.Hkv) * std::max(1, (per_head + p.chunk - 1) / p.chunk);
  }
}
}  // namespace

void set_bwd_column_chunk(int tiles) { g_bwd_chunk = std::max(-1, tiles); }

// The compacted grid (bwd_pieces.cu; the default): set_bwd_compact(false) launches the full grid,
// whose pieces without tiles leave after reading their column (test_attention_cuda compares them).
namespace {
bool g_bwd_compact = true;
}  // namespace
void set_bwd_compact(bool on) { g_bwd_compact = on; }

size_t bwd_work_bytes(int n_blocks, int max_doc_blocks, int64_t kept, AttnShape s) {
  if (n_blocks <= 0 || !use_sm90(s.block_size) || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0) return 0;
  BwdParams p{};
  p.H = s.n_heads;
  p.Hkv = s.n_kv_heads;
  column_split(p, max_doc_blocks, s.block_size, kept);
  return p.n_split > 1 ? compact_scratch_bytes(int64_t(n_blocks) * p.Hkv * p.n_split) : 0;
}
namespace {
unsigned long long* g_bwd_trace = nullptr;
int64_t g_bwd_trace_ctas = 0;
}  // namespace
void set_bwd_trace(unsigned long long* buf, int64_t ctas) {
  g_bwd_trace = buf;
  g_bwd_trace_ctas = buf ? ctas : 0;
}

// The workspace: dq_acc (N x H x D), delta (N x H), lse2 (N x H), then (at a 256-byte boundary) the column
// split's dkv_acc (2 x N x Hkv x D), all fp32.
size_t block_attention_bwd_workspace(int64_t n_tokens, AttnShape s) { return attention_bwd_workspace_bytes(n_tokens, s); }

void block_attention_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* out, const float* lse,
                         const bf16* dout, const DeviceSelection& sel, AttnShape s, bf16* dq, bf16* dk,
                         bf16* dv, void* workspace, cudaStream_t stream) {
  if (sel.n_blocks == 0) return;
  if (sel.block_size != s.block_size || sel.n_kv_heads != s.n_kv_heads || sel.n_heads != s.n_heads ||
      s.n_heads % s.n_kv_heads != 0)
    throw Error("cuda::block_attention_bwd: selection does not match the attention shape");
  const int D = s.head_dim;
  const int64_t rows = sel.n_tokens * s.n_heads;
  float* dq_acc = static_cast<float*>(workspace);
  float* delta = dq_acc + rows * D;
  float* lse2 = delta + rows;
  {
    const int threads = 256;
    const int64_t nblk = (rows * 32 + threads - 1) / threads;
    if (D == 64) bwd_prep_kernel<64><<<unsigned(nblk), threads, 0, stream>>>(out, dout, lse, delta, lse2, dq_acc, rows);
    else if (D == 128) bwd_prep_kernel<128><<<unsigned(nblk), threads, 0, stream>>>(out, dout, lse, delta, lse2, dq_acc, rows);
    else throw Error("cuda::block_attention_bwd: head_dim must be 64 or 128");
    SB_CUDA_CHECK_LAUNCH("bwd_prep_kernel");
  }
  const double scale = 1.0 / std::sqrt(double(D));
  BwdParams p{q, k, v, dout, lse, delta, dq_acc, dk, dv, sel.blocks, sel.row_base, sel.col_ptr, sel.col_rows,
              s.n_heads, s.n_kv_heads, float(scale), float(1.4426950408889634 * scale), sel.bwd_items};
  const bool tiled = use_sm90(s.block_size);  // the wgmma backward: dq_acc in the tiled layout
  if (tiled) {
    column_split(p, sel.max_doc_blocks, s.block_size, sel.kept);
    p.n_tokens = sel.n_tokens;
    p.lse2 = lse2;
    p.trace = g_bwd_trace;
    p.trace_ctas = g_bwd_trace_ctas;
    p.dkv_acc = reinterpret_cast<float*>(static_cast<char*>(workspace) + dkv_acc_offset(sel.n_tokens, s));
    if (p.chunk > 0)
      SB_CUDA_CHECK(cudaMemsetAsync(p.dkv_acc, 0, 2 * size_t(sel.n_tokens) * s.n_kv_heads * D * sizeof(float), stream));
    p.n_items = sel.n_blocks * p.Hkv;
    const BwdCompact compact{p.n_split > 1 && g_bwd_compact, sel.max_kept, sel.bwd_work, sel.bwd_work_size};
    launch_bwd_sm90(p, D, sel.n_tokens, compact, stream);
    if (p.chunk > 0) {
      if (D == 64) dkv_convert_kernel<64><<<sel.n_blocks * p.Hkv, 256, 0, stream>>>(p);
      else dkv_convert_kernel<128><<<sel.n_blocks * p.Hkv, 256, 0, stream>>>(p);
      SB_CUDA_CHECK_LAUNCH("dkv_convert_kernel");
    }
  }
  else if (D == 64 && s.block_size == 64) launch_bwd<64, 64>(p, sel.n_blocks, stream);
  else if (D == 64 && s.block_size == 128) launch_bwd<64, 128>(p, sel.n_blocks, stream);
  else if (D == 128 && s.block_size == 64) launch_bwd<128, 64>(p, sel.n_blocks, stream);
  else if (D == 128 && s.block_size == 128) launch_bwd<128, 128>(p, sel.n_blocks, stream);
  else throw Error("cuda::block_attention_bwd: head_dim must be 64 or 128, block_size 64 or 128");
  const int64_t n2 = rows * D / 2;
  const unsigned grid = unsigned(std::min<int64_t>((n2 + 255) / 256, int64_t(sm_count()) * 16));
  if (tiled) {
    if (D == 64) dq_convert_tiled_kernel<64><<<grid, 256, 0, stream>>>(dq_acc, dq, float(scale), sel.n_tokens, s.n_heads);
    else dq_convert_tiled_kernel<128><<<grid, 256, 0, stream>>>(dq_acc, dq, float(scale), sel.n_tokens, s.n_heads);
  } else {
    dq_convert_kernel<<<grid, 256, 0, stream>>>(dq_acc, dq, float(scale), n2);
  }
  SB_CUDA_CHECK_LAUNCH("dq_convert_kernel");
}

}  // namespace sb::kernels::cuda
