// True recall of sampled selection rows: the dense softmax attention mass on the kept blocks
// (kernels.hpp, true_recall), and the oracle gate's forcing of key blocks into a selection.
// Cost per row: block_size x (query heads of the group) x (i + 1) x block_size x D, so DST samples
// a few rows per layer (balance.recall_rows) and the diagnostics their answer rows.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_common.hpp"

namespace sb::kernels {

RowPlace place_row(const BlockSelection& sel, const int32_t* cu_seqlens, int ndocs, AttnShape s, int64_t row) {
  // doc_row_base is ascending: the document is the last base <= row
  auto it = std::upper_bound(sel.doc_row_base.begin(), sel.doc_row_base.begin() + ndocs + 1, row);
  const int d = int(it - sel.doc_row_base.begin()) - 1;
  const int L = cu_seqlens[d + 1] - cu_seqlens[d], nb = cpu::num_blocks(L, s.block_size);
  const int64_t r = row - sel.doc_row_base[size_t(d)];
  return {d, int(r / nb), int(r % nb), cu_seqlens[d], L};
}

template <class T>
void true_recall(const T* q, const T* k, const int32_t* cu_seqlens, int ndocs, AttnShape s, const BlockSelection& sel,
                 const int64_t* rows, int nrows, float* out) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, Bs = s.block_size, G = H / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  cpu::host_for("true_recall", nrows, [=, &sel](int64_t n) {
    const RowPlace p = place_row(sel, cu_seqlens, ndocs, s, rows[n]);
    std::vector<char> kept(size_t(p.i) + 1, 0);
    for (int64_t c = sel.row_ptr[size_t(rows[n])]; c < sel.row_ptr[size_t(rows[n]) + 1]; c++) kept[size_t(sel.cols[size_t(c)])] = 1;
    const int t_lo = p.i * Bs, t_hi = std::min(p.doc_len, t_lo + Bs);  // query tokens, within the document
    std::vector<double> sc(static_cast<size_t>(t_hi));
    double mass = 0;
    for (int t = t_lo; t < t_hi; t++)
      for (int h = p.g * G; h < (p.g + 1) * G; h++) {
        const T* qt = q + (int64_t(p.doc_begin + t) * H + h) * D;
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= t; j++) {  // token-causal: query t sees keys 0..t of its document
          const T* kj = k + (int64_t(p.doc_begin + j) * Hkv + p.g) * D;
          double acc = 0;
          for (int d = 0; d < D; d++) acc += double(qt[d]) * double(kj[d]);
          sc[size_t(j)] = acc * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double all = 0, in = 0;
        for (int j = 0; j <= t; j++) {
          const double e = std::exp(sc[size_t(j)] - mx);
          all += e;
          if (kept[size_t(j / Bs)]) in += e;
        }
        mass += in / all;
      }
    out[n] = float(mass / (double(t_hi - t_lo) * G));
  });
}

void force_blocks(BlockSelection& sel, const int32_t* cu_seqlens, int ndocs, AttnShape s, int doc,
                  const std::vector<int32_t>& blocks) {
  const int L = cu_seqlens[doc + 1] - cu_seqlens[doc], nb = cpu::num_blocks(L, s.block_size);
  const int64_t first = sel.doc_row_base[size_t(doc)], last = first + int64_t(s.n_kv_heads) * nb;
  std::vector<int64_t> row_ptr(1, 0);
  std::vector<int32_t> cols;
  cols.reserve(sel.cols.size());
  const int64_t rows = int64_t(sel.row_ptr.size()) - 1;
  for (int64_t r = 0; r < rows; r++) {
    const auto b = sel.cols.begin() + sel.row_ptr[size_t(r)], e = sel.cols.begin() + sel.row_ptr[size_t(r) + 1];
    if (r < first || r >= last) {
      cols.insert(cols.end(), b, e);
    } else {  // the row's own blocks and the forced ones it may see (j <= i), ascending, once each
      const int i = int((r - first) % nb);
      std::vector<int32_t> row(b, e);
      for (int32_t j : blocks)
        if (j >= 0 && j <= i) row.push_back(j);
      std::sort(row.begin(), row.end());
      row.erase(std::unique(row.begin(), row.end()), row.end());
      cols.insert(cols.end(), row.begin(), row.end());
    }
    row_ptr.push_back(int64_t(cols.size()));
  }
  sel.row_ptr = std::move(row_ptr);
  sel.cols = std::move(cols);
}

template void true_recall<float>(const float*, const float*, const int32_t*, int, AttnShape, const BlockSelection&,
                                 const int64_t*, int, float*);
template void true_recall<double>(const double*, const double*, const int32_t*, int, AttnShape, const BlockSelection&,
                                  const int64_t*, int, float*);

}  // namespace sb::kernels
