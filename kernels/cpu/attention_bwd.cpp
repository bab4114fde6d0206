// Block-sparse attention backward: recompute P from the saved lse, tile by tile over the kept blocks.
//   dP = dO V^T;  Delta = rowsum(dO * O);  dS = P * (dP - Delta)
//   dQ += scale dS K;  dK += scale dS^T Q;  dV += P^T dO
#include <cmath>

#include "kernels/cpu/cpu_common.hpp"

namespace sb::kernels {

// q,out,dout,dq (N,H,D); k,v,dk,dv (N,Hkv,D); lse (N,H)
template <class T>
void block_attention_bwd(const T* q, const T* k, const T* v, const T* out, const T* lse, const T* dout,
                         const int32_t* cu_seqlens, int ndocs, AttnShape s, const BlockSelection& sel,
                         T* dq, T* dk, T* dv) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, Bs = s.block_size, G = H / Hkv;
  const T scale = T(1.0 / std::sqrt(double(D)));
  const int64_t* row_base = sel.doc_row_base.data();
  const int64_t* row_ptr = sel.row_ptr.data();
  const int32_t* cols = sel.cols.data();
  // One task per (doc, kv head): it owns dk/dv of that head and dq of the group's query heads in
  // that document, so the += accumulations never race.
  cpu::host_for("block_attention_bwd", int64_t(ndocs) * Hkv, [=](int64_t task) {
    const int d = int(task / Hkv), g = int(task % Hkv);
    const int t_begin = cu_seqlens[d], L = cu_seqlens[d + 1] - t_begin, nb = cpu::num_blocks(L, Bs);
    if (L <= 0) return;
    for (int64_t t = t_begin; t < t_begin + L; t++) {
      for (int e = 0; e < D; e++) dk[(t * Hkv + g) * D + e] = dv[(t * Hkv + g) * D + e] = T(0);
      for (int h = g * G; h < (g + 1) * G; h++)
        for (int e = 0; e < D; e++) dq[(t * H + h) * D + e] = T(0);
    }
    std::vector<T> P(size_t(Bs) * Bs), dS(size_t(Bs) * Bs), delta(Bs);  // (Bq, Bk) tiles; (Bq)
    for (int h = g * G; h < (g + 1) * G; h++) {
      for (int i = 0; i < nb; i++) {
        const int t0 = t_begin + i * Bs, Bq = std::min(Bs, L - i * Bs);
        const int64_t row = row_base[d] + int64_t(g) * nb + i;
        const T* Qi = q + (int64_t(t0) * H + h) * D;  // (Bq, D), stride H*D (same for dO, dQ)
        const T* dOi = dout + (int64_t(t0) * H + h) * D;
        T* dQi = dq + (int64_t(t0) * H + h) * D;
        for (int r = 0; r < Bq; r++) {  // Delta = rowsum(dO * O)
          const T* o = out + ((int64_t(t0) + r) * H + h) * D;
          T acc = 0;
          for (int e = 0; e < D; e++) acc += dOi[size_t(r) * H * D + e] * o[e];
          delta[r] = acc;
        }
        for (int64_t c = row_ptr[row]; c < row_ptr[row + 1]; c++) {
          const int j = cols[c];
          const int u0 = t_begin + j * Bs, Bk = std::min(Bs, L - j * Bs);
          const T* Kj = k + (int64_t(u0) * Hkv + g) * D;  // (Bk, D), stride Hkv*D (same for V, dK, dV)
          const T* Vj = v + (int64_t(u0) * Hkv + g) * D;
          T* dKj = dk + (int64_t(u0) * Hkv + g) * D;
          T* dVj = dv + (int64_t(u0) * Hkv + g) * D;
          // P = exp(scale * Qi Kj^T - lse), zero above the diagonal of the diagonal block
          gemm<T>(false, true, Bq, Bk, D, scale, Qi, H * D, Kj, Hkv * D, T(0), P.data(), Bk);
          // dP = dOi Vj^T (into dS)
          gemm<T>(false, true, Bq, Bk, D, T(1), dOi, H * D, Vj, Hkv * D, T(0), dS.data(), Bk);
          const bool diag = (j == i);
          for (int r = 0; r < Bq; r++) {
            const T lr = lse[(int64_t(t0) + r) * H + h];
            T* Pr = P.data() + size_t(r) * Bk;
            T* dSr = dS.data() + size_t(r) * Bk;
            const int ncol = diag ? r + 1 : Bk;
            cpu::exp_shifted(Pr, ncol, lr);
            const T dr = delta[r];
            for (int c2 = 0; c2 < ncol; c2++) dSr[c2] = Pr[c2] * (dSr[c2] - dr);
            for (int c2 = ncol; c2 < Bk; c2++) Pr[c2] = dSr[c2] = T(0);
          }
          // dQi (Bq,D) += scale dS Kj;  dKj (Bk,D) += scale dS^T Qi;  dVj (Bk,D) += P^T dOi
          gemm<T>(false, false, Bq, D, Bk, scale, dS.data(), Bk, Kj, Hkv * D, T(1), dQi, H * D);
          gemm<T>(true, false, Bk, D, Bq, scale, dS.data(), Bk, Qi, H * D, T(1), dKj, Hkv * D);
          gemm<T>(true, false, Bk, D, Bq, T(1), P.data(), Bk, dOi, H * D, T(1), dVj, Hkv * D);
        }
      }
    }
  });
}

template void block_attention_bwd<float>(const float*, const float*, const float*, const float*, const float*,
                                         const float*, const int32_t*, int, AttnShape, const BlockSelection&,
                                         float*, float*, float*);
template void block_attention_bwd<double>(const double*, const double*, const double*, const double*,
                                          const double*, const double*, const int32_t*, int, AttnShape,
                                          const BlockSelection&, double*, double*, double*);

}  // namespace sb::kernels
