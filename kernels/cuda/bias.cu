// The bias of a linear layer on the GPU (Qwen2's q/k/v projections; kernels/cpu/dense.cpp's
// bias_add_fwd/bwd): the GEMM writes bf16 y = x W^T, the forward adds the fp32 master bias to every
// row, the backward sums dy's columns into the fp32 bias gradient.
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"

namespace sb::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColThreads = 128, kChunk = 64;  // backward: columns per CTA, rows per chunk

// y (N,out) bf16 += b (out) fp32, the sum rounded once to bf16. Grid-stride, 64-bit indices.
__global__ void __launch_bounds__(kThreads) bias_add_fwd_kernel(bf16* y, const float* b, int64_t n, int out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + b[i % out]);
}

// db (out) += sum_t dy[t, :], rows ld apart. One thread per column and chunk of kChunk rows (a warp
// reads a row's consecutive columns), then one fp32 atomicAdd per column and chunk.
__global__ void __launch_bounds__(kColThreads) bias_add_bwd_kernel(const bf16* dy, float* db, int N, int out,
                                                                   int64_t ld) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= out) return;
  const int64_t t0 = int64_t(blockIdx.x) * kChunk, t1 = t0 + kChunk < N ? t0 + kChunk : N;
  float acc = 0;
  for (int64_t t = t0; t < t1; ++t) acc += __bfloat162float(dy[t * ld + c]);
  atomicAdd(db + c, acc);
}

}  // namespace

void bias_add_fwd(bf16* y, const float* b, int N, int out, cudaStream_t stream) {
  if (N <= 0 || out <= 0) return;
  const int64_t n = int64_t(N) * out;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  bias_add_fwd_kernel<<<unsigned(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(y, b, n, out);
  SB_CUDA_CHECK_LAUNCH("bias_add_fwd_kernel");
}

void bias_add_bwd(const bf16* dy, float* db, int N, int out, cudaStream_t stream, int ld) {
  if (N <= 0 || out <= 0) return;
  // chunks on x (up to 2^31 - 1 blocks), column blocks on y (out / 128 stays far below 65535)
  const dim3 grid(unsigned((N + kChunk - 1) / kChunk), unsigned((out + kColThreads - 1) / kColThreads));
  bias_add_bwd_kernel<<<grid, kColThreads, 0, stream>>>(dy, db, N, out, ld > 0 ? ld : out);
  SB_CUDA_CHECK_LAUNCH("bias_add_bwd_kernel");
}

}  // namespace sb::kernels::cuda
