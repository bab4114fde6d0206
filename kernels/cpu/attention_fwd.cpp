// Block-sparse attention forward (FlashAttention-style online softmax over the kept key blocks of
// each query block) and the plain reference used by the tests.
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_common.hpp"

namespace sb::kernels {

// q,out (N,H,D); k,v (N,Hkv,D); lse (N,H)
template <class T>
void block_attention_fwd(const T* q, const T* k, const T* v, const int32_t* cu_seqlens, int ndocs,
                         AttnShape s, const BlockSelection& sel, T* out, T* lse) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, Bs = s.block_size, G = H / Hkv;
  const T scale = T(1.0 / std::sqrt(double(D)));
  const std::vector<cpu::QBlock> qb = cpu::query_blocks(cu_seqlens, ndocs, Bs);
  const cpu::QBlock* QB = qb.data();
  const int64_t* row_base = sel.doc_row_base.data();
  const int64_t* row_ptr = sel.row_ptr.data();
  const int32_t* cols = sel.cols.data();
  // One task per (query block, query head): each writes its own rows of out and lse.
  cpu::host_for("block_attention_fwd", int64_t(qb.size()) * H, [=](int64_t task) {
    const cpu::QBlock b = QB[task / H];
    const int h = int(task % H), g = h / G;
    const int Bq = b.len, doc_t0 = cu_seqlens[b.doc], doc_end = cu_seqlens[b.doc + 1];
    const int64_t row = row_base[b.doc] + int64_t(g) * b.nb + b.i;
    std::vector<T> S(size_t(Bs) * Bs);     // (Bq, Bk) scores, then probabilities
    std::vector<T> O(size_t(Bq) * D, T(0));  // (Bq, D) unnormalised output
    std::vector<T> m(Bq, -std::numeric_limits<T>::infinity()), l(Bq, T(0));  // running max, sum
    const T* Qi = q + (int64_t(b.t0) * H + h) * D;  // (Bq, D), row stride H*D
    for (int64_t c = row_ptr[row]; c < row_ptr[row + 1]; c++) {
      const int j = cols[c];
      const int u0 = doc_t0 + j * Bs, Bk = std::min(Bs, doc_end - u0);
      const T* Kj = k + (int64_t(u0) * Hkv + g) * D;  // (Bk, D), row stride Hkv*D
      const T* Vj = v + (int64_t(u0) * Hkv + g) * D;
      // S = scale * Qi @ Kj^T
      gemm<T>(false, true, Bq, Bk, D, scale, Qi, H * D, Kj, Hkv * D, T(0), S.data(), Bk);
      const bool diag = (j == b.i);
      for (int r = 0; r < Bq; r++) {
        T* Sr = S.data() + size_t(r) * Bk;
        const int ncol = diag ? r + 1 : Bk;  // causal inside the diagonal block: key u <= query t
        const T mx = cpu::row_max(Sr, ncol, m[r]);
        const T corr = std::exp(m[r] - mx);  // 0 on the first tile (m = -inf)
        cpu::exp_shifted(Sr, ncol, mx);
        const T sum = cpu::row_sum(Sr, ncol);
        for (int c2 = ncol; c2 < Bk; c2++) Sr[c2] = T(0);
        l[r] = l[r] * corr + sum;
        m[r] = mx;
        if (corr != T(1)) {
          T* Or = O.data() + size_t(r) * D;
          for (int d = 0; d < D; d++) Or[d] *= corr;
        }
      }
      // O += P @ Vj
      gemm<T>(false, false, Bq, D, Bk, T(1), S.data(), Bk, Vj, Hkv * D, T(1), O.data(), D);
    }
    for (int r = 0; r < Bq; r++) {
      const int64_t t = b.t0 + r;
      const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);  // an empty row (no kept block) gives 0
      for (int d = 0; d < D; d++) out[(t * H + h) * D + d] = O[size_t(r) * D + d] * inv;
      lse[t * H + h] = l[r] > T(0) ? m[r] + std::log(l[r]) : std::numeric_limits<T>::infinity();
    }
  });
}

// Reference: per query token, scores against every allowed key (kept block, u <= t), softmax and
// weighted sum, all in double. q,out (N,H,D); k,v (N,Hkv,D).
template <class T>
void reference_attention_fwd(const T* q, const T* k, const T* v, const int32_t* cu_seqlens, int ndocs,
                             AttnShape s, const BlockSelection& sel, T* out) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, Bs = s.block_size, G = H / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  for (int d = 0; d < ndocs; d++) {
    const int t_begin = cu_seqlens[d], L = cu_seqlens[d + 1] - t_begin, nb = cpu::num_blocks(L, Bs);
    for (int h = 0; h < H; h++) {
      const int g = h / G;
      for (int tt = 0; tt < L; tt++) {
        const int i = tt / Bs;
        const int64_t row = sel.doc_row_base[d] + int64_t(g) * nb + i;
        std::vector<char> kept(nb, 0);
        for (int64_t c = sel.row_ptr[row]; c < sel.row_ptr[row + 1]; c++) kept[sel.cols[c]] = 1;
        std::vector<double> sc(tt + 1, -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        const int64_t t = t_begin + tt;
        for (int uu = 0; uu <= tt; uu++) {
          if (!kept[uu / Bs]) continue;
          const int64_t u = t_begin + uu;
          double acc = 0;
          for (int e = 0; e < D; e++) acc += double(q[(t * H + h) * D + e]) * double(k[(u * Hkv + g) * D + e]);
          sc[uu] = acc * scale;
          mx = std::max(mx, sc[uu]);
        }
        std::vector<double> o(D, 0.0);
        double z = 0;
        for (int uu = 0; uu <= tt; uu++) {
          if (!kept[uu / Bs]) continue;
          const double pr = std::exp(sc[uu] - mx);
          z += pr;
          const int64_t u = t_begin + uu;
          for (int e = 0; e < D; e++) o[e] += pr * double(v[(u * Hkv + g) * D + e]);
        }
        for (int e = 0; e < D; e++) out[(t * H + h) * D + e] = z > 0 ? T(o[e] / z) : T(0);
      }
    }
  }
}

template void block_attention_fwd<float>(const float*, const float*, const float*, const int32_t*, int, AttnShape,
                                         const BlockSelection&, float*, float*);
template void block_attention_fwd<double>(const double*, const double*, const double*, const int32_t*, int,
                                          AttnShape, const BlockSelection&, double*, double*);
template void reference_attention_fwd<float>(const float*, const float*, const float*, const int32_t*, int,
                                             AttnShape, const BlockSelection&, float*);
template void reference_attention_fwd<double>(const double*, const double*, const double*, const int32_t*, int,
                                              AttnShape, const BlockSelection&, double*);

}  // namespace sb::kernels
