// Dense algebra: gemm through OpenBLAS (row-major), the linear layer (and its bias) and the
// chunked LM head built on it.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_common.hpp"

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

template <class T>
double lm_head_loss(const T* x, const T* W, const int32_t* targets, int N, int C, int V, int chunk, T scale, T* dx,
                    T* dW, uint8_t* correct, int32_t* argmax) {
  const int rows = chunk > 0 ? std::min(chunk, N) : N;
  std::vector<T> z(size_t(std::max(rows, 0)) * V);  // (rows, V) logits, then dlogits in place
  double loss = 0;
  for (int t0 = 0; t0 < N; t0 += rows) {
    const int n = std::min(rows, N - t0);
    const T* xc = x + size_t(t0) * C;
    T* zc = z.data();
    linear_fwd(xc, W, zc, n, C, V);
    if (argmax)  // before cross_entropy overwrites the logits
      cpu::host_for("lm_head_argmax", n, [=](int64_t t) {
        const T* row = zc + t * V;
        argmax[t0 + t] = int32_t(std::max_element(row, row + V) - row);
      });
    loss += cross_entropy(zc, targets + t0, zc, n, V, scale, correct ? correct + t0 : nullptr);
    if (dx) gemm<T>(false, false, n, C, V, T(1), zc, V, W, C, T(0), dx + size_t(t0) * C, C);  // this chunk's rows
    if (dW) gemm<T>(true, false, V, C, n, T(1), zc, V, xc, C, T(1), dW, C);                 // summed over chunks
  }
  return loss;
}

template void linear_fwd<float>(const float*, const float*, float*, int, int, int);
template void linear_fwd<double>(const double*, const double*, double*, int, int, int);
template void linear_bwd<float>(const float*, const float*, const float*, float*, float*, int, int, int);
template void linear_bwd<double>(const double*, const double*, const double*, double*, double*, int, int, int);
template double lm_head_loss<float>(const float*, const float*, const int32_t*, int, int, int, int, float, float*,
                                    float*, uint8_t*, int32_t*);
template double lm_head_loss<double>(const double*, const double*, const int32_t*, int, int, int, int, double,
                                     double*, double*, uint8_t*, int32_t*);

template void bias_add_fwd<float>(float*, const float*, int, int);
template void bias_add_fwd<double>(double*, const double*, int, int);
template void bias_add_bwd<float>(const float*, float*, int, int);
template void bias_add_bwd<double>(const double*, double*, int, int);

}  // namespace sb::kernels
