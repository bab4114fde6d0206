// The bias of a linear layer on the GPU (Qwen2's q/k/v projections; kernels/cpu/dense.cpp's
// bias_add_fwd/bwd): the GEMM writes bf16 y = x W^T, the forward adds the fp32 master bias to every
// row, the backward sums dy's columns into the fp32 bias gradient.
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"

namespace sb::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 8;  // backward CTA: 32 columns x kRows threads

// y (N,out) bf16 += b (out) fp32, the sum rounded once to bf16. Grid-stride, 64-bit indices.
__global__ void __launch_bounds__(kThreads) bias_add_fwd_kernel(bf16* y, const float* b, int64_t n, int out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + b[i % out]);
}

// db (out) += sum_t dy[t, :]. CTA = 32 columns x kRows threads walking `chunk` rows; the partial sums
// are reduced over the CTA's rows in shared memory, then one fp32 atomicAdd per column and CTA (as
// rmsnorm's dw in ops.cu).
__global__ void __launch_bounds__(32 * kRows) bias_add_bwd_kernel(const bf16* dy, float* db, int N, int out,
                                                                  int chunk) {
  __shared__ float part[kRows][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.y) * chunk;
  const int64_t t1 = t0 + chunk < N ? t0 + chunk : N;
  float acc = 0;
  if (c < out)
    for (int64_t t = t0 + threadIdx.y; t < t1; t += kRows) acc += __bfloat162float(dy[t * out + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < out) {
    for (int r = 1; r < kRows; r++) acc += part[r][threadIdx.x];
    atomicAdd(db + c, acc);
  }
}

}  // namespace

void bias_add_fwd(bf16* y, const float* b, int N, int out, cudaStream_t stream) {
  if (N <= 0 || out <= 0) return;
  const int64_t n = int64_t(N) * out;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  bias_add_fwd_kernel<<<unsigned(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(y, b, n, out);
  SB_CUDA_CHECK_LAUNCH("bias_add_fwd_kernel");
}

void bias_add_bwd(const bf16* dy, float* db, int N, int out, cudaStream_t stream) {
  if (N <= 0 || out <= 0) return;
  int chunk = (N + 65534) / 65535;  // gridDim.y <= 65535
  if (chunk < 256) chunk = 256;
  const dim3 grid(unsigned((out + 31) / 32), unsigned((N + chunk - 1) / chunk));
  bias_add_bwd_kernel<<<grid, dim3(32, kRows), 0, stream>>>(dy, db, N, out, chunk);
  SB_CUDA_CHECK_LAUNCH("bias_add_bwd_kernel");
}

}  // namespace sb::kernels::cuda
