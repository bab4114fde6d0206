// bf16 GEMMs through cuBLAS (fp32 accumulation), row-major like kernels::gemm, and the linear layer
// built on them (as kernels/cpu/dense.cpp).
//
// Row-major <-> column-major: a row-major (R, S) matrix with leading dimension ld is, byte for byte,
// the column-major (S, R) matrix (its transpose) with the same ld. So the row-major product
//   C (M,N) = op(A) (M,K) @ op(B) (K,N)
// is the column-major product
//   C^T (N,M) = op(B)^T (N,K) @ op(A)^T (K,M),
// i.e. cuBLAS gets B first and A second, m = N, n = M, k = K, and the same transpose flags: when
// trans_b is false, B's memory read column-major is already B^T = op(B)^T (CUBLAS_OP_N); when trans_b
// is true, B's memory is a row-major (N,K) matrix X with op(B) = X^T, whose column-major view is X^T,
// and op(B)^T = X is obtained with CUBLAS_OP_T. Likewise for A. Leading dimensions pass through.
#include <cublas_v2.h>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"

namespace sb::kernels::cuda {

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  SB_CUBLAS_CHECK(cublasCreate(&h_));
  try {
    SB_CUBLAS_CHECK(cublasSetStream(h_, stream));
    // Default math: bf16 inputs with CUBLAS_COMPUTE_32F run on the tensor cores (CUBLAS_TENSOR_OP_MATH
    // is deprecated and means FAST_16F for fp32 routines). Disallow reduced-precision reductions, so
    // split-K partial sums stay fp32 even when C is bf16.
    SB_CUBLAS_CHECK(cublasSetMathMode(h_, cublasMath_t(CUBLAS_DEFAULT_MATH |
                                                       CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  } catch (...) {
    cublasDestroy(h_);  // the destructor does not run when the constructor throws
    throw;
  }
}

Blas::~Blas() {
  if (h_) cublasDestroy(h_);  // no check: destructors must not throw; frees the handle's workspace
}

namespace {

cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

// C (M,N) row-major, ldc; c_type CUDA_R_32F or CUDA_R_16BF. See the mapping at the top of the file.
void gemm_ex(Blas& b, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
             const bf16* B, int ldb, float beta, void* C, cudaDataType_t c_type, int ldc) {
  if (M <= 0 || N <= 0) return;  // nothing to write (cuBLAS would also reject ld >= max(1, m) oddities)
  SB_CUBLAS_CHECK(cublasGemmEx(b.handle(), op(trans_b), op(trans_a), /*m=*/N, /*n=*/M, /*k=*/K, &alpha,
                               B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, c_type, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void gemm(Blas& b, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc) {
  gemm_ex(b, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, CUDA_R_32F, ldc);
}

void gemm(Blas& b, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, bf16* C, int ldc) {
  gemm_ex(b, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, CUDA_R_16BF, ldc);
}

// x (N,in), W (out,in) -> y (N,out) = x @ W^T. beta = 0: y is not read (may hold garbage).
void linear_fwd(Blas& b, const bf16* x, const bf16* W, float* y, int N, int in, int out) {
  gemm(b, false, true, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}
void linear_fwd(Blas& b, const bf16* x, const bf16* W, bf16* y, int N, int in, int out) {
  gemm(b, false, true, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

// dy (N,out): dx (N,in) (+)= dy @ W; dW (out,in) += dy^T @ x.
template <class DX>
static void linear_bwd_impl(Blas& b, const bf16* x, const bf16* W, const bf16* dy, DX* dx, bool accumulate_dx,
                            float* dW, int N, int in, int out) {
  if (dx) gemm(b, false, false, N, in, out, 1.0f, dy, out, W, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dW) gemm(b, true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

void linear_bwd(Blas& b, const bf16* x, const bf16* W, const bf16* dy, float* dx, bool accumulate_dx, float* dW,
                int N, int in, int out) {
  linear_bwd_impl(b, x, W, dy, dx, accumulate_dx, dW, N, in, out);
}
void linear_bwd(Blas& b, const bf16* x, const bf16* W, const bf16* dy, bf16* dx, bool accumulate_dx, float* dW,
                int N, int in, int out) {
  linear_bwd_impl(b, x, W, dy, dx, accumulate_dx, dW, N, in, out);
}

}  // namespace sb::kernels::cuda
