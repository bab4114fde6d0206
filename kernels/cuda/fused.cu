// Fused elementwise kernels of the layer on the GPU (issue 18 item 4): each one replaces a chain of
// ops.cu / bias.cu launches that made separate passes over the same (N, C) or (N, heads * D) arrays.
// Same formulas and the same roundings as the chains they replace (see ops_cuda.hpp), so the fused
// and unfused paths agree to fp32 summation order (test_ops_cuda checks each against its chain;
// bench_fused_cuda times them side by side). The CUDA model runs these, on the packed projections.
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace sb::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBwdCtas = 1056;  // rmsnorm backward: 8 CTAs per SM of an H200, rows strided over them
constexpr int kMaxSmemC = 6000;    // rmsnorm backward: C doubles of dw partials + block_sum's 256 B <= 48 KB

// ---- residual add + rmsnorm + bf16 ----
// xm (N,C) fp32 += x; y (N,C) bf16 = xm / rms(xm) * w; rstd (N). One CTA per row; sum of squares in
// double as rmsnorm_fwd. Replaces: copy x -> xm, the GEMM adding into xm, rmsnorm_fwd (xm read twice more).
__global__ void __launch_bounds__(kThreads) add_rmsnorm_fwd_kernel(float* xm, const float* x, const float* w,
                                                                    bf16* y, float* rstd, int C, float eps) {
  const int64_t t = blockIdx.x;
  float* mt = xm + t * C;        // (C)
  const float* xt = x + t * C;   // (C)
  double ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = mt[c] + xt[c];
    mt[c] = v;
    ss = __fma_rn(double(v), double(v), ss);  // as rmsnorm_fwd: the same rstd bits
  }
  ss = block_sum(ss);  // each thread reads back only the columns it wrote
  const float r = float(1.0 / sqrt(ss / C + double(eps)));
  if (threadIdx.x == 0) rstd[t] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[t * C + c] = __float2bfloat16(mt[c] * r * w[c]);
}

// ---- rmsnorm backward, one pass ----
// dx (N,C) += r*dy*w - x * (r^3/C * sum_c dy*w*x); dx16 = bf16(dx) (optional: the next GEMM's input);
// dw (C) += sum_t dy*x*r. Rows strided over the CTAs; each thread keeps the dw partials of its own
// columns in shared memory (double, as rmsnorm_bwd_dw), one fp32 atomicAdd per column and CTA at the
// end. Replaces rmsnorm_bwd's dx and dw kernels (x and dy read twice) and to_bf16 (dx read again).
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_fused_kernel(const float* x, const float* w,
                                                                      const float* rstd, const float* dy, float* dx,
                                                                      bf16* dx16, float* dw, int N, int C) {
  extern __shared__ double dwp[];  // (C)
  for (int c = threadIdx.x; c < C; c += blockDim.x) dwp[c] = 0;
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    const float* xt = x + t * C;    // (C)
    const float* dyt = dy + t * C;  // (C)
    const double rd = rstd[t];
    const float r = float(rd), k = rmsnorm_bwd_coef(xt, dyt, w, rd, C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xv = xt[c], g = dyt[c];
      const float v = dx[t * C + c] + (r * g * w[c] - xv * k);
      dx[t * C + c] = v;
      if (dx16) dx16[t * C + c] = __float2bfloat16(v);
      dwp[c] += double(g) * xv * rd;
    }
  }
  if (!dw) return;
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dw + c, float(dwp[c]));
}

// ---- bias + RoPE of q and k (+ the v bias), one launch ----
// Rows of q (H*D), k and v (Hkv*D) bf16 at their own row strides (elements): the separate arrays
// (stride = width) or the column blocks of one packed (N, H*D + 2*Hkv*D) projection output.
struct QkvRows {
  bf16 *q, *k, *v;
  int64_t ldq, ldk, ldv;
};
// in -> out (in == out: in place); biases fp32 (nullptr: none). One thread per (token, pair
// d < D/2): the angle once for all H + Hkv heads. With biases each element is first rounded to
// bf16(x + b) as bias_add_fwd writes it, so this equals bias_add_fwd then rope_fwd. v is written
// when it has a bias or goes to another array (its bits copied).
__global__ void __launch_bounds__(kThreads) qkv_rope_kernel(QkvRows in, QkvRows out, const float* bq,
                                                             const float* bk, const float* bv, const int32_t* pos,
                                                             int N, int H, int Hkv, int D, double theta,
                                                             float sign) {
  const int half = D / 2;
  const bool do_v = bv || in.v != out.v;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(N) * half;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / half;
    const int d = int(i - t * half);
    float sn, cs;
    rope_sincos(pos[t], d, D, theta, sign, sn, cs);
    rope_rotate(in.q + t * in.ldq, out.q + t * out.ldq, H, D, d, sn, cs, bq);    // (H, D)
    rope_rotate(in.k + t * in.ldk, out.k + t * out.ldk, Hkv, D, d, sn, cs, bk);  // (Hkv, D)
    if (!do_v) continue;
    const bf16* vi = in.v + t * in.ldv;  // (Hkv, D)
    bf16* vo = out.v + t * out.ldv;
    for (int h = 0; h < Hkv; h++)
      for (const int j : {h * D + d, h * D + d + half})
        vo[j] = bv ? __float2bfloat16(__bfloat162float(vi[j]) + bv[j]) : vi[j];
  }
}

// ---- SwiGLU, 16 bytes per load ----
// As ops.cu's swiglu kernels (same math, swiglu.cuh), 8 bf16 per thread and array, over `rows` rows
// of c8 uint4: h and dh rows back to back (c8 apart), gate/up/dgate/dup rows s8 apart (s8 = c8:
// separate arrays; 2 * c8: the two halves of one packed (rows, 2F) gate|up projection). One row:
// flat arrays. Rows on grid y, columns on grid x, both strided.
union Bf8 {
  uint4 u;
  bf16 h[8];
};
__global__ void __launch_bounds__(kThreads) swiglu_fwd_wide_kernel(const uint4* gate, const uint4* up, uint4* h,
                                                                    int64_t rows, int64_t c8, int64_t s8) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < c8; c += int64_t(gridDim.x) * blockDim.x) {
      Bf8 g{gate[r * s8 + c]}, u{up[r * s8 + c]}, o;
      for (int j = 0; j < 8; j++)
        o.h[j] = __float2bfloat16(swiglu_h(__bfloat162float(g.h[j]), __bfloat162float(u.h[j])));
      h[r * c8 + c] = o.u;
    }
}
__global__ void __launch_bounds__(kThreads) swiglu_bwd_wide_kernel(const uint4* gate, const uint4* up,
                                                                    const uint4* dh, uint4* dgate, uint4* dup,
                                                                    int64_t rows, int64_t c8, int64_t s8) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < c8; c += int64_t(gridDim.x) * blockDim.x) {
      const int64_t gi = r * s8 + c;
      Bf8 g{gate[gi]}, u{up[gi]}, d{dh[r * c8 + c]}, og, ou;
      for (int j = 0; j < 8; j++) {
        float a, b;
        swiglu_grads(__bfloat162float(g.h[j]), __bfloat162float(u.h[j]), __bfloat162float(d.h[j]), a, b);
        og.h[j] = __float2bfloat16(a);
        ou.h[j] = __float2bfloat16(b);
      }
      dgate[gi] = og.u;
      dup[gi] = ou.u;
    }
}

// Scalar twins for packed rows whose width is not a multiple of 8 (the flat arrays fall back to
// ops.cu's kernels): one thread per element of (rows, F), gate/up/dgate/dup rows 2F apart.
__global__ void __launch_bounds__(kThreads) swiglu_fwd_packed_kernel(const bf16* gu, bf16* h, int64_t rows,
                                                                      int64_t F) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < F; c += int64_t(gridDim.x) * blockDim.x) {
      const bf16* g = gu + r * 2 * F;  // (2F): gate | up
      h[r * F + c] = __float2bfloat16(swiglu_h(__bfloat162float(g[c]), __bfloat162float(g[F + c])));
    }
}
__global__ void __launch_bounds__(kThreads) swiglu_bwd_packed_kernel(const bf16* gu, const bf16* dh, bf16* dgu,
                                                                      int64_t rows, int64_t F) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < F; c += int64_t(gridDim.x) * blockDim.x) {
      float a, b;
      const int64_t gi = r * 2 * F + c;
      swiglu_grads(__bfloat162float(gu[gi]), __bfloat162float(gu[gi + F]), __bfloat162float(dh[r * F + c]), a, b);
      dgu[gi] = __float2bfloat16(a);
      dgu[gi + F] = __float2bfloat16(b);
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 ? b : 65536);
}

// (columns, rows) of the swiglu kernels: columns per CTA on x, rows on y (at most 65535, strided)
dim3 grid_rows(int64_t cols, int64_t rows) {
  const int64_t bx = (cols + kThreads - 1) / kThreads;
  return dim3(unsigned(bx < 65536 ? bx : 65536), unsigned(rows < 65535 ? rows : 65535));
}

void launch_qkv_rope(QkvRows in, QkvRows out, const float* bq, const float* bk, const float* bv, const int32_t* pos,
                     int N, int H, int Hkv, int D, double theta, float sign, cudaStream_t stream) {
  const int64_t pairs = int64_t(N) * (D / 2);
  if (pairs <= 0) return;
  qkv_rope_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(in, out, bq, bk, bv, pos, N, H, Hkv, D, theta, sign);
  SB_CUDA_CHECK_LAUNCH("qkv_rope_kernel");
}

}  // namespace

void add_rmsnorm_fwd(float* xm, const float* x, const float* w, bf16* y, float* rstd, int N, int C, float eps,
                     cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  add_rmsnorm_fwd_kernel<<<N, kThreads, 0, stream>>>(xm, x, w, y, rstd, C, eps);
  SB_CUDA_CHECK_LAUNCH("add_rmsnorm_fwd_kernel");
}

void rmsnorm_bwd_fused(const float* x, const float* w, const float* rstd, const float* dy, float* dx, bf16* dx16,
                       float* dw, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C > kMaxSmemC) {  // the dw partials would not fit in shared memory: the unfused chain
    rmsnorm_bwd(x, w, rstd, dy, dx, dw, N, C, stream);
    if (dx16) to_bf16(dx, dx16, size_t(N) * C, stream);
    return;
  }
  const int ctas = N < kMaxBwdCtas ? N : kMaxBwdCtas;
  rmsnorm_bwd_fused_kernel<<<ctas, kThreads, size_t(C) * sizeof(double), stream>>>(x, w, rstd, dy, dx, dx16, dw, N,
                                                                                   C);
  SB_CUDA_CHECK_LAUNCH("rmsnorm_bwd_fused_kernel");
}

void qkv_rope_fwd(bf16* q, bf16* k, bf16* v, const float* bq, const float* bk, const float* bv, const int32_t* pos,
                  int N, int H, int Hkv, int D, double theta, cudaStream_t stream) {
  const QkvRows rows{q, k, v, int64_t(H) * D, int64_t(Hkv) * D, int64_t(Hkv) * D};
  launch_qkv_rope(rows, rows, bq, bk, bv, pos, N, H, Hkv, D, theta, 1.0f, stream);
}

void qk_rope_bwd(bf16* dq, bf16* dk, const int32_t* pos, int N, int H, int Hkv, int D, double theta,
                 cudaStream_t stream) {
  const QkvRows rows{dq, dk, nullptr, int64_t(H) * D, int64_t(Hkv) * D, 0};
  launch_qkv_rope(rows, rows, nullptr, nullptr, nullptr, pos, N, H, Hkv, D, theta, -1.0f, stream);
}

void qkv_rope_unpack_fwd(const bf16* qkv, bf16* q, bf16* k, bf16* v, const float* bq, const float* bk,
                         const float* bv, const int32_t* pos, int N, int H, int Hkv, int D, double theta,
                         cudaStream_t stream) {
  const int64_t HD = int64_t(H) * D, KD = int64_t(Hkv) * D, P = HD + 2 * KD;
  bf16* p = const_cast<bf16*>(qkv);  // read only: QkvRows holds both directions
  launch_qkv_rope({p, p + HD, p + HD + KD, P, P, P}, {q, k, v, HD, KD, KD}, bq, bk, bv, pos, N, H, Hkv, D, theta, 1.0f,
                  stream);
}

void qkv_rope_pack_bwd(const bf16* dq, const bf16* dk, const bf16* dv, bf16* dqkv, const int32_t* pos, int N, int H,
                       int Hkv, int D, double theta, cudaStream_t stream) {
  const int64_t HD = int64_t(H) * D, KD = int64_t(Hkv) * D, P = HD + 2 * KD;
  launch_qkv_rope({const_cast<bf16*>(dq), const_cast<bf16*>(dk), const_cast<bf16*>(dv), HD, KD, KD},
                  {dqkv, dqkv + HD, dqkv + HD + KD, P, P, P}, nullptr, nullptr, nullptr, pos, N, H, Hkv, D, theta,
                  -1.0f, stream);
}

void swiglu_fwd_wide(const bf16* gate, const bf16* up, bf16* h, size_t n, cudaStream_t stream) {
  if (n % 8 || !aligned16(gate) || !aligned16(up) || !aligned16(h)) return swiglu_fwd(gate, up, h, n, stream);
  if (n == 0) return;
  const int64_t n8 = int64_t(n / 8);
  swiglu_fwd_wide_kernel<<<grid_rows(n8, 1), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(gate), reinterpret_cast<const uint4*>(up), reinterpret_cast<uint4*>(h), 1, n8, n8);
  SB_CUDA_CHECK_LAUNCH("swiglu_fwd_wide_kernel");
}

void swiglu_bwd_wide(const bf16* gate, const bf16* up, const bf16* dh, bf16* dgate, bf16* dup, size_t n,
                     cudaStream_t stream) {
  if (n % 8 || !aligned16(gate) || !aligned16(up) || !aligned16(dh) || !aligned16(dgate) || !aligned16(dup))
    return swiglu_bwd(gate, up, dh, dgate, dup, n, stream);
  if (n == 0) return;
  const int64_t n8 = int64_t(n / 8);
  swiglu_bwd_wide_kernel<<<grid_rows(n8, 1), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(gate), reinterpret_cast<const uint4*>(up), reinterpret_cast<const uint4*>(dh),
      reinterpret_cast<uint4*>(dgate), reinterpret_cast<uint4*>(dup), 1, n8, n8);
  SB_CUDA_CHECK_LAUNCH("swiglu_bwd_wide_kernel");
}

void swiglu_fwd_packed(const bf16* gu, bf16* h, int N, int F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  if (F % 8 || !aligned16(gu) || !aligned16(h)) {
    swiglu_fwd_packed_kernel<<<grid_rows(F, N), kThreads, 0, stream>>>(gu, h, N, F);
    SB_CUDA_CHECK_LAUNCH("swiglu_fwd_packed_kernel");
    return;
  }
  const int64_t c8 = F / 8;
  const uint4* g = reinterpret_cast<const uint4*>(gu);
  swiglu_fwd_wide_kernel<<<grid_rows(c8, N), kThreads, 0, stream>>>(g, g + c8, reinterpret_cast<uint4*>(h), N, c8,
                                                                     2 * c8);
  SB_CUDA_CHECK_LAUNCH("swiglu_fwd_wide_kernel (packed)");
}

void swiglu_bwd_packed(const bf16* gu, const bf16* dh, bf16* dgu, int N, int F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  if (F % 8 || !aligned16(gu) || !aligned16(dh) || !aligned16(dgu)) {
    swiglu_bwd_packed_kernel<<<grid_rows(F, N), kThreads, 0, stream>>>(gu, dh, dgu, N, F);
    SB_CUDA_CHECK_LAUNCH("swiglu_bwd_packed_kernel");
    return;
  }
  const int64_t c8 = F / 8;
  const uint4* g = reinterpret_cast<const uint4*>(gu);
  uint4* d = reinterpret_cast<uint4*>(dgu);
  swiglu_bwd_wide_kernel<<<grid_rows(c8, N), kThreads, 0, stream>>>(g, g + c8, reinterpret_cast<const uint4*>(dh), d,
                                                                     d + c8, N, c8, 2 * c8);
  SB_CUDA_CHECK_LAUNCH("swiglu_bwd_wide_kernel (packed)");
}

}  // namespace sb::kernels::cuda
