// Fused cross-entropy of the LM head (ops_cuda.hpp): one CTA per row of V logits, fp32 or bf16.
// Pass 1 keeps the online softmax (max, sum of exp) and the argmax; pass 2 writes dlogits, over the
// logits themselves when they are bf16 (in place: the chunk needs one buffer, not two).
// The row is streamed in 16-byte loads, four in flight per thread: with one scalar load a thread
// the kernel was latency-bound at ~2 TB/s (ncu, V = 151,936: bench/gpu/ncu_step.sh).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"

namespace sb::kernels::cuda {
namespace {

constexpr int kCeThreads = 512;  // one CTA streams a whole row
constexpr int kUnroll = 4;       // 16-byte loads in flight per thread

// Running state of one row: online softmax (max m, sum s of exp(z - m)) and argmax (value, index).
struct CeAcc {
  float m, s, bv;
  int bi;
};

__device__ void ce_merge(CeAcc& a, const CeAcc& b) {
  if (b.m > a.m) {  // rescale a's sum to b's max (a.s = 0 when a.m = -inf: 0 * 0)
    a.s = a.s * expf(a.m - b.m) + b.s;
    a.m = b.m;
  } else if (b.s != 0.0f) {  // b.s > 0 implies b.m finite; a NaN sum (a NaN logit) carries over, as on the CPU
    a.s += b.s * expf(b.m - a.m);
  }
  if (b.bv > a.bv || (b.bv == a.bv && b.bi < a.bi)) {  // ties -> lowest index, as std::max_element
    a.bv = b.bv;
    a.bi = b.bi;
  }
}

__device__ CeAcc ce_shfl(const CeAcc& a, int o) {
  return {__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o),
          __shfl_xor_sync(0xffffffffu, a.bv, o), __shfl_xor_sync(0xffffffffu, a.bi, o)};
}

__device__ float to_f(float x) { return x; }
__device__ float to_f(bf16 x) { return __bfloat162float(x); }

// W consecutive logits starting at index v0 (ascending) into acc: their max first, then one rescale,
// so a vector costs W exponentials. -inf adds 0; a NaN makes the sum NaN (as the scalar update did).
template <int W>
__device__ void ce_add(CeAcc& acc, const float (&x)[W], int v0) {
  float lm = x[0];
#pragma unroll
  for (int i = 1; i < W; i++) lm = fmaxf(lm, x[i]);
#pragma unroll
  for (int i = 0; i < W; i++)
    if (x[i] > acc.bv) acc.bv = x[i], acc.bi = v0 + i;  // strict: the first maximum kept
  const float m = fmaxf(acc.m, lm);
  if (m == -INFINITY) {  // all -inf so far (or NaN alone): only a NaN changes the sum
#pragma unroll
    for (int i = 0; i < W; i++)
      if (x[i] != x[i]) acc.s = x[i];
    return;
  }
  float s = acc.s * expf(acc.m - m);  // 0 when acc.m = -inf
#pragma unroll
  for (int i = 0; i < W; i++) s += expf(x[i] - m);
  acc.s = s, acc.m = m;
}

// W = 16 bytes / sizeof(T) values a load when the row is 16-byte aligned (VEC), else one at a time.
template <class T, bool VEC>
__global__ void __launch_bounds__(kCeThreads) cross_entropy_kernel(const T* logits, const int32_t* targets,
                                                                    float* loss, bf16* dlogits, int32_t* argmax,
                                                                    int V, float scale) {
  constexpr int W = VEC ? 16 / int(sizeof(T)) : 1;
  __shared__ CeAcc sh[kCeThreads / 32];
  const int64_t t = blockIdx.x;
  const T* z = logits + t * V;  // (V)
  const int32_t y = targets[t];
  // z[y] before pass 2 may overwrite it (dlogits in place)
  const float zy = threadIdx.x == 0 && y >= 0 ? to_f(z[y]) : 0.0f;
  CeAcc acc{-INFINITY, 0.0f, -INFINITY, INT32_MAX};
  const int nv = V / W, step = int(blockDim.x);
  auto load = [&](int c, float (&x)[W]) {
    if constexpr (VEC) {
      const uint4 u = reinterpret_cast<const uint4*>(z)[c];
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int i = 0; i < W; i++) x[i] = to_f(e[i]);
    } else {
      x[0] = to_f(z[c]);
    }
  };
  int c = int(threadIdx.x);
  for (; c + (kUnroll - 1) * step < nv; c += kUnroll * step) {  // kUnroll loads issued before any use
    float x[kUnroll][W];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) load(c + u * step, x[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; u++) ce_add<W>(acc, x[u], (c + u * step) * W);
  }
  for (; c < nv; c += step) {
    float x[W];
    load(c, x);
    ce_add<W>(acc, x, c * W);
  }
  for (int o = 16; o > 0; o >>= 1) ce_merge(acc, ce_shfl(acc, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sh[w] = acc;
  __syncthreads();
  if (w == 0) {
    acc = lane < nw ? sh[lane] : CeAcc{-INFINITY, 0.0f, -INFINITY, INT32_MAX};
    for (int o = 16; o > 0; o >>= 1) ce_merge(acc, ce_shfl(acc, o));
    if (lane == 0) sh[0] = acc;
  }
  __syncthreads();
  acc = sh[0];
  const float lse = acc.m + logf(acc.s);
  if (threadIdx.x == 0) {
    if (loss) loss[t] = y >= 0 ? (acc.m - zy) + logf(acc.s) : 0.0f;  // m - z[y] first: exact near the max
    if (argmax) argmax[t] = acc.bi < V ? acc.bi : 0;                // all-NaN row: 0, as the CPU
  }
  if (!dlogits) return;
  bf16* dz = dlogits + t * V;  // (V), may be z itself: each element read, then written, by one thread
  auto grad = [&](int v, float x) {  // untargeted rows: 0
    return __float2bfloat16(y >= 0 ? scale * (expf(x - lse) - (v == y ? 1.0f : 0.0f)) : 0.0f);
  };
  if constexpr (VEC && sizeof(T) == 2) {  // bf16 in, bf16 out: 8 a store
    for (int c2 = int(threadIdx.x); c2 < nv; c2 += step) {
      float x[W];
      load(c2, x);
      uint4 u;
      bf16* e = reinterpret_cast<bf16*>(&u);
#pragma unroll
      for (int i = 0; i < W; i++) e[i] = grad(c2 * W + i, x[i]);
      reinterpret_cast<uint4*>(dz)[c2] = u;
    }
  } else if constexpr (VEC) {  // fp32 in: 4 logits, one 8-byte store
    for (int c2 = int(threadIdx.x); c2 < nv; c2 += step) {
      float x[W];
      load(c2, x);
      __nv_bfloat162 o[2] = {__halves2bfloat162(grad(c2 * W, x[0]), grad(c2 * W + 1, x[1])),
                             __halves2bfloat162(grad(c2 * W + 2, x[2]), grad(c2 * W + 3, x[3]))};
      reinterpret_cast<uint2*>(dz)[c2] = *reinterpret_cast<const uint2*>(o);
    }
  } else {
    for (int v = int(threadIdx.x); v < V; v += step) dz[v] = grad(v, to_f(z[v]));
  }
}

template <class T>
void launch(const T* logits, const int32_t* targets, float* loss, bf16* dlogits, int32_t* argmax, int N, int V,
            float scale, cudaStream_t stream) {
  if (N <= 0 || V <= 0) return;
  // every row 16-byte aligned: the base and the row pitch; the bf16 output at half the pitch
  const bool vec = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && (int64_t(V) * int64_t(sizeof(T))) % 16 == 0 &&
                   (!dlogits || (reinterpret_cast<uintptr_t>(dlogits) % 16 == 0 && (int64_t(V) * 2) % 16 == 0));
  if (vec)
    cross_entropy_kernel<T, true><<<N, kCeThreads, 0, stream>>>(logits, targets, loss, dlogits, argmax, V, scale);
  else
    cross_entropy_kernel<T, false><<<N, kCeThreads, 0, stream>>>(logits, targets, loss, dlogits, argmax, V, scale);
  SB_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
}

}  // namespace

void cross_entropy(const float* logits, const int32_t* targets, float* loss, bf16* dlogits, int32_t* argmax, int N,
                   int V, float scale, cudaStream_t stream) {
  launch(logits, targets, loss, dlogits, argmax, N, V, scale, stream);
}

void cross_entropy_inplace(bf16* logits, const int32_t* targets, float* loss, bool grad, int32_t* argmax, int N, int V,
                           float scale, cudaStream_t stream) {
  launch<bf16>(logits, targets, loss, grad ? logits : nullptr, argmax, N, V, scale, stream);
}

}  // namespace sb::kernels::cuda
