// Dense algebra: gemm through OpenBLAS (row-major) and the linear layer (and its bias) built on it.
#include <cblas.h>

#include "kernels/kernels.hpp"

namespace sb::kernels {

static CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

template <>
void gemm<float>(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, tr(trans_a), tr(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                  const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, tr(trans_a), tr(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// x (N,in), W (out,in) -> y (N,out) = x @ W^T
template <class T>
void linear_fwd(const T* x, const T* W, T* y, int N, int in, int out) {
  gemm<T>(false, true, N, out, in, T(1), x, in, W, in, T(0), y, out);
}

// dy (N,out): dx (N,in) += dy @ W; dW (out,in) += dy^T @ x
template <class T>
void linear_bwd(const T* x, const T* W, const T* dy, T* dx, T* dW, int N, int in, int out) {
  if (dx) gemm<T>(false, false, N, in, out, T(1), dy, out, W, in, T(1), dx, in);
  if (dW) gemm<T>(true, false, out, in, N, T(1), dy, out, x, in, T(1), dW, in);
}

template <class T>
void bias_add_fwd(T* y, const T* b, int N, int out) {
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < out; ++j) y[size_t(t) * out + j] += b[j];
}

template <class T>
void bias_add_bwd(const T* dy, T* db, int N, int out) {
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < out; ++j) db[j] += dy[size_t(t) * out + j];
}

template void linear_fwd<float>(const float*, const float*, float*, int, int, int);
template void linear_fwd<double>(const double*, const double*, double*, int, int, int);
template void linear_bwd<float>(const float*, const float*, const float*, float*, float*, int, int, int);
template void linear_bwd<double>(const double*, const double*, const double*, double*, double*, int, int, int);

template void bias_add_fwd<float>(float*, const float*, int, int);
template void bias_add_fwd<double>(double*, const double*, int, int);
template void bias_add_bwd<float>(const float*, float*, int, int);
template void bias_add_bwd<double>(const double*, double*, int, int);

}  // namespace sb::kernels
