// True recall (kernels::true_recall) against a plain reference: exp(lse over the kept blocks - lse
// over every causal key), the two log-sum-exps from the attention kernel itself with the selection
// and with every causal block, averaged over the row's tokens and its group's heads; random q and k,
// random and gated selections, GQA, documents shorter than a block and with partial last blocks.
// force_blocks (the oracle gate) against its definition.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = sb::kernels;
using sbtest::Rng;

namespace {

const std::vector<int32_t> kCu = {0, 3, 16, 24, 45};  // 3 (< a block), 13 (partial), 8, 21 tokens
const int kDocs = 4, kN = 45;
const k::AttnShape kShape{4, 2, 8, 4};  // GQA groups of 2, D 8, blocks of 4

k::BlockSelection random_selection(Rng& rng, double keep) {
  k::BlockSelection sel;
  k::select_all_causal(kCu.data(), kDocs, kShape, sel);  // the row layout, then thin the rows
  std::vector<int64_t> ptr = {0};
  std::vector<int32_t> cols;
  for (size_t r = 0; r + 1 < sel.row_ptr.size(); r++) {
    const int i = sel.cols[size_t(sel.row_ptr[r + 1] - 1)];  // the diagonal: the row's last block
    for (int64_t c = sel.row_ptr[r]; c < sel.row_ptr[r + 1]; c++)
      if (sel.cols[size_t(c)] == i || rng.uniform(0, 1) < keep) cols.push_back(sel.cols[size_t(c)]);
    ptr.push_back(int64_t(cols.size()));
  }
  sel.row_ptr = ptr, sel.cols = cols;
  return sel;
}

// The reference: per row, mean over its tokens and group heads of exp(lse_sel - lse_all).
std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& kk, const k::BlockSelection& sel,
                              const std::vector<int64_t>& rows) {
  const int H = kShape.n_heads, D = kShape.head_dim, Hkv = kShape.n_kv_heads, G = H / Hkv;
  std::vector<double> v(kk.size()), out(size_t(kN) * H * D), lse_sel(size_t(kN) * H), lse_all(size_t(kN) * H);
  for (size_t i = 0; i < v.size(); i++) v[i] = 0.1 * double(i % 7);
  k::BlockSelection all;
  k::select_all_causal(kCu.data(), kDocs, kShape, all);
  k::block_attention_fwd<double>(q.data(), kk.data(), v.data(), kCu.data(), kDocs, kShape, sel, out.data(), lse_sel.data());
  k::block_attention_fwd<double>(q.data(), kk.data(), v.data(), kCu.data(), kDocs, kShape, all, out.data(), lse_all.data());
  std::vector<double> want;
  for (int64_t r : rows) {
    const k::RowPlace p = k::place_row(sel, kCu.data(), kDocs, kShape, r);
    double m = 0;
    int n = 0;
    for (int t = p.i * kShape.block_size; t < std::min(p.doc_len, (p.i + 1) * kShape.block_size); t++, n++)
      for (int h = p.g * G; h < (p.g + 1) * G; h++) {
        const size_t at = size_t(p.doc_begin + t) * H + h;
        m += std::exp(lse_sel[at] - lse_all[at]);
      }
    want.push_back(m / (n * G));
  }
  return want;
}

void check(const std::vector<double>& q, const std::vector<double>& kk, const k::BlockSelection& sel) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < sel.doc_row_base.back(); r++) rows.push_back(r);
  const std::vector<double> want = reference(q, kk, sel, rows);
  std::vector<float> got(rows.size()), gotf(rows.size());
  k::true_recall<double>(q.data(), kk.data(), kCu.data(), kDocs, kShape, sel, rows.data(), int(rows.size()), got.data());
  std::vector<float> qf(q.begin(), q.end()), kf(kk.begin(), kk.end());
  k::true_recall<float>(qf.data(), kf.data(), kCu.data(), kDocs, kShape, sel, rows.data(), int(rows.size()), gotf.data());
  int below_one = 0;
  for (size_t i = 0; i < rows.size(); i++) {
    EXPECT_NEAR(got[i], want[i], 2e-6) << "row " << rows[i];
    EXPECT_NEAR(gotf[i], want[i], 2e-5) << "row " << rows[i];
    EXPECT_GT(got[i], 0.f);
    EXPECT_LE(got[i], 1.f + 1e-6f);
    below_one += want[i] < 0.999;
  }
  EXPECT_GT(below_one, 0) << "no row dropped any mass: the selection tests nothing";
}

}  // namespace

TEST(KernelsTrueRecall, MatchesTheAttentionsOwnLogSumExpsOnRandomSelections) {
  Rng rng(41);
  const auto q = rng.vec(size_t(kN) * kShape.n_heads * kShape.head_dim, 1.5);
  const auto kk = rng.vec(size_t(kN) * kShape.n_kv_heads * kShape.head_dim, 1.5);
  for (double keep : {0.2, 0.6}) check(q, kk, random_selection(rng, keep));
}

TEST(KernelsTrueRecall, GatedSelectionAndEveryBlockKept) {
  Rng rng(42);
  const auto q = rng.vec(size_t(kN) * kShape.n_heads * kShape.head_dim, 1.5);
  const auto kk = rng.vec(size_t(kN) * kShape.n_kv_heads * kShape.head_dim, 1.5);
  k::BlockSelection sel;
  k::gate_blocks<double>(q.data(), kk.data(), kCu.data(), kDocs, kShape, {0, 0, 8.0}, sel);  // anchors only
  check(q, kk, sel);
  // every causal block kept: true recall 1 on every row
  k::select_all_causal(kCu.data(), kDocs, kShape, sel);
  std::vector<int64_t> rows = {0, 3, 7, 12, 20};
  std::vector<float> got(rows.size());
  k::true_recall<double>(q.data(), kk.data(), kCu.data(), kDocs, kShape, sel, rows.data(), int(rows.size()), got.data());
  for (float r : got) EXPECT_NEAR(r, 1.0, 1e-6);
}

TEST(KernelsTrueRecall, ForceBlocksAddsTheBlocksToTheDocumentsRowsOnly) {
  Rng rng(43);
  k::BlockSelection sel = random_selection(rng, 0.3), before = sel;
  const std::vector<int32_t> forced = {1, 3};
  k::force_blocks(sel, kCu.data(), kDocs, kShape, 3, forced);  // document 3: 21 tokens, 6 blocks
  ASSERT_EQ(sel.row_ptr.size(), before.row_ptr.size());
  for (int64_t r = 0; r + 1 < int64_t(sel.row_ptr.size()); r++) {
    std::vector<int32_t> was(before.cols.begin() + before.row_ptr[size_t(r)], before.cols.begin() + before.row_ptr[size_t(r) + 1]);
    std::vector<int32_t> now(sel.cols.begin() + sel.row_ptr[size_t(r)], sel.cols.begin() + sel.row_ptr[size_t(r) + 1]);
    const k::RowPlace p = k::place_row(sel, kCu.data(), kDocs, kShape, r);
    if (p.doc == 3)
      for (int32_t j : forced)
        if (j <= p.i && std::find(was.begin(), was.end(), j) == was.end()) was.push_back(j);
    std::sort(was.begin(), was.end());
    EXPECT_EQ(now, was) << "row " << r;
  }
}
