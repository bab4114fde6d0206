// Block-sparse attention: forward against the reference and a plain dense causal attention written
// here, backward against central finite differences (random sparse and gated selections, GQA,
// documents shorter than a block and with partial last blocks).
#include <gtest/gtest.h>

#include <limits>

#include "kernels/cpu/cpu_common.hpp"
#include "kernels/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = sb::kernels;
using sbtest::Rng;

namespace {

// Documents of 3 (shorter than a block), 13 (partial last block), 8 (exact) and 21 tokens.
const std::vector<int32_t> kCu = {0, 3, 16, 24, 45};
const int kDocs = 4, kN = 45;
const k::AttnShape kShape{4, 2, 8, 4};  // H=4, Hkv=2 (GQA groups of 2), D=8, block 4

int nblocks(int d, const k::AttnShape& s) { return (kCu[d + 1] - kCu[d] + s.block_size - 1) / s.block_size; }

// Random subset of j <= i per row; the diagonal always kept (as gating does).
k::BlockSelection random_selection(Rng& rng, const k::AttnShape& s, double keep_prob) {
  k::BlockSelection sel;
  sel.doc_row_base = {0};
  sel.row_ptr = {0};
  for (int d = 0; d < kDocs; d++) {
    int nb = nblocks(d, s);
    sel.doc_row_base.push_back(sel.doc_row_base.back() + int64_t(s.n_kv_heads) * nb);
    for (int g = 0; g < s.n_kv_heads; g++)
      for (int i = 0; i < nb; i++) {
        for (int j = 0; j <= i; j++)
          if (j == i || rng.uniform(0, 1) < keep_prob) sel.cols.push_back(j);
        sel.row_ptr.push_back(int64_t(sel.cols.size()));
        sel.recall.push_back(1.0f);
      }
  }
  return sel;
}

// Plain dense causal softmax attention per document, in double; also returns lse (N,H).
void dense_causal(const std::vector<double>& q, const std::vector<double>& kk, const std::vector<double>& v,
                  const k::AttnShape& s, std::vector<double>& out, std::vector<double>& lse) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim;
  out.assign(size_t(kN) * H * D, 0.0);
  lse.assign(size_t(kN) * H, 0.0);
  for (int d = 0; d < kDocs; d++)
    for (int h = 0; h < H; h++) {
      int g = h / (H / Hkv);
      for (int t = kCu[d]; t < kCu[d + 1]; t++) {
        std::vector<double> p;
        for (int u = kCu[d]; u <= t; u++) {
          double acc = 0;
          for (int e = 0; e < D; e++) acc += q[(t * H + h) * D + e] * kk[(u * Hkv + g) * D + e];
          p.push_back(acc / std::sqrt(double(D)));
        }
        double mx = *std::max_element(p.begin(), p.end()), z = 0;
        for (auto& x : p) z += (x = std::exp(x - mx));
        lse[t * H + h] = mx + std::log(z);
        for (int u = kCu[d]; u <= t; u++)
          for (int e = 0; e < D; e++) out[(t * H + h) * D + e] += p[u - kCu[d]] / z * v[(u * Hkv + g) * D + e];
      }
    }
}

struct Inputs {
  std::vector<double> q, k, v;
  explicit Inputs(Rng& rng, const k::AttnShape& s)
      : q(rng.vec(size_t(kN) * s.n_heads * s.head_dim, 1.5)),
        k(rng.vec(size_t(kN) * s.n_kv_heads * s.head_dim, 1.5)),
        v(rng.vec(size_t(kN) * s.n_kv_heads * s.head_dim)) {}
};

template <class T>
std::vector<T> cast(const std::vector<double>& x) { return std::vector<T>(x.begin(), x.end()); }

// Forward of block attention vs the reference for one selection, float and double.
void check_fwd_vs_reference(const Inputs& in, const k::BlockSelection& sel) {
  const size_t nq = in.q.size();
  std::vector<double> out(nq), ref(nq), lse(kN * kShape.n_heads);
  k::block_attention_fwd<double>(in.q.data(), in.k.data(), in.v.data(), kCu.data(), kDocs, kShape, sel,
                                 out.data(), lse.data());
  k::reference_attention_fwd<double>(in.q.data(), in.k.data(), in.v.data(), kCu.data(), kDocs, kShape, sel,
                                     ref.data());
  EXPECT_LT(sbtest::rel_err(out, ref), 1e-12);
  auto qf = cast<float>(in.q), kf = cast<float>(in.k), vf = cast<float>(in.v);
  std::vector<float> outf(nq), lsef(kN * kShape.n_heads);
  k::block_attention_fwd<float>(qf.data(), kf.data(), vf.data(), kCu.data(), kDocs, kShape, sel, outf.data(),
                                lsef.data());
  EXPECT_LT(sbtest::rel_err(outf, ref), 1e-5);
  EXPECT_LT(sbtest::rel_err(lsef, lse), 1e-5);
}

// Backward of block attention vs central differences of loss = sum(out * wr), for q, k and v.
void check_bwd_fd(Inputs in, const k::BlockSelection& sel, Rng& rng) {
  const int H = kShape.n_heads;
  std::vector<double> out(in.q.size()), lse(kN * H);
  auto wr = rng.vec(in.q.size());
  auto loss = [&] {
    k::block_attention_fwd<double>(in.q.data(), in.k.data(), in.v.data(), kCu.data(), kDocs, kShape, sel,
                                   out.data(), lse.data());
    return sbtest::dot(out, wr);
  };
  loss();
  // dq, dk, dv are overwritten: start them from garbage.
  std::vector<double> dq(in.q.size(), 3.0), dk(in.k.size(), 3.0), dv(in.v.size(), 3.0);
  k::block_attention_bwd<double>(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), wr.data(),
                                 kCu.data(), kDocs, kShape, sel, dq.data(), dk.data(), dv.data());
  EXPECT_LT(sbtest::fd_check(in.q, dq, loss), 1e-7);
  EXPECT_LT(sbtest::fd_check(in.k, dk, loss), 1e-7);
  EXPECT_LT(sbtest::fd_check(in.v, dv, loss), 1e-7);
  // Float backward agrees with double.
  auto qf = cast<float>(in.q), kf = cast<float>(in.k), vf = cast<float>(in.v), wf = cast<float>(wr);
  std::vector<float> of(in.q.size()), lf(kN * H), dqf(in.q.size()), dkf(in.k.size()), dvf(in.v.size());
  k::block_attention_fwd<float>(qf.data(), kf.data(), vf.data(), kCu.data(), kDocs, kShape, sel, of.data(),
                                lf.data());
  k::block_attention_bwd<float>(qf.data(), kf.data(), vf.data(), of.data(), lf.data(), wf.data(), kCu.data(),
                                kDocs, kShape, sel, dqf.data(), dkf.data(), dvf.data());
  loss();
  k::block_attention_bwd<double>(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), wr.data(),
                                 kCu.data(), kDocs, kShape, sel, dq.data(), dk.data(), dv.data());
  EXPECT_LT(sbtest::rel_err(dqf, dq), 1e-5);
  EXPECT_LT(sbtest::rel_err(dkf, dk), 1e-5);
  EXPECT_LT(sbtest::rel_err(dvf, dv), 1e-5);
}

}  // namespace

TEST(KernelsAttention, ForwardMatchesReferenceOnRandomSelections) {
  Rng rng(31);
  Inputs in(rng, kShape);
  for (double keep : {0.0, 0.3, 0.7}) {
    SCOPED_TRACE(keep);
    check_fwd_vs_reference(in, random_selection(rng, kShape, keep));
  }
}

TEST(KernelsAttention, AllBlocksKeptEqualsDenseCausal) {
  Rng rng(32);
  Inputs in(rng, kShape);
  std::vector<double> ref, ref_lse;
  dense_causal(in.q, in.k, in.v, kShape, ref, ref_lse);
  k::BlockSelection dense, gated;
  k::GatingStats st = k::select_all_causal(kCu.data(), kDocs, kShape, dense);
  EXPECT_EQ(st.density(), 1.0);
  EXPECT_EQ(st.recall(), 1.0);
  // Gating with a budget and threshold larger than any row keeps everything: the same selection.
  k::gate_blocks<double>(in.q.data(), in.k.data(), kCu.data(), kDocs, kShape, {1000, 1, 1e9}, gated);
  EXPECT_EQ(gated.cols, dense.cols);
  EXPECT_EQ(gated.row_ptr, dense.row_ptr);
  for (const auto* sel : {&dense, &gated}) {
    std::vector<double> out(in.q.size()), lse(kN * kShape.n_heads), refsel(in.q.size());
    k::block_attention_fwd<double>(in.q.data(), in.k.data(), in.v.data(), kCu.data(), kDocs, kShape, *sel,
                                   out.data(), lse.data());
    k::reference_attention_fwd<double>(in.q.data(), in.k.data(), in.v.data(), kCu.data(), kDocs, kShape, *sel,
                                       refsel.data());
    EXPECT_LT(sbtest::rel_err(out, ref), 1e-12);
    EXPECT_LT(sbtest::rel_err(refsel, ref), 1e-12);
    EXPECT_LT(sbtest::rel_err(lse, ref_lse), 1e-12);
  }
}

TEST(KernelsAttention, BackwardMatchesFiniteDifferencesRandomSelection) {
  Rng rng(33);
  Inputs in(rng, kShape);
  check_bwd_fd(in, random_selection(rng, kShape, 0.5), rng);
}

TEST(KernelsAttention, BackwardMatchesFiniteDifferencesGatedSelection) {
  Rng rng(34);
  Inputs in(rng, kShape);
  k::BlockSelection sel;
  k::GatingStats st = k::gate_blocks<double>(in.q.data(), in.k.data(), kCu.data(), kDocs, kShape, {1, 1, 0.5}, sel);
  EXPECT_LT(st.density(), 1.0) << "the gated selection must actually be sparse";
  check_fwd_vs_reference(in, sel);
  check_bwd_fd(in, sel, rng);
}

TEST(KernelsAttention, BackwardMatchesFiniteDifferencesDenseNoGqa) {
  Rng rng(35);
  const k::AttnShape s{2, 2, 4, 4};
  std::vector<double> q = rng.vec(kN * 2 * 4), kk = rng.vec(kN * 2 * 4), v = rng.vec(kN * 2 * 4), wr = rng.vec(kN * 2 * 4);
  k::BlockSelection sel;
  k::select_all_causal(kCu.data(), kDocs, s, sel);
  std::vector<double> out(q.size()), lse(kN * 2);
  auto loss = [&] {
    k::block_attention_fwd<double>(q.data(), kk.data(), v.data(), kCu.data(), kDocs, s, sel, out.data(), lse.data());
    return sbtest::dot(out, wr);
  };
  loss();
  std::vector<double> dq(q.size()), dk(kk.size()), dv(v.size());
  k::block_attention_bwd<double>(q.data(), kk.data(), v.data(), out.data(), lse.data(), wr.data(), kCu.data(), kDocs,
                                 s, sel, dq.data(), dk.data(), dv.data());
  EXPECT_LT(sbtest::fd_check(q, dq, loss), 1e-7);
  EXPECT_LT(sbtest::fd_check(kk, dk, loss), 1e-7);
  EXPECT_LT(sbtest::fd_check(v, dv, loss), 1e-7);
}

TEST(KernelsAttention, SoftmaxExpMatchesStdExp) {
  // The float softmax uses a vectorisable exp (kernels/cpu/cpu_common.hpp); check it on a fine grid.
  double worst = 0;
  for (int i = 0; i <= 860000; i++) {
    float x = -1e-4f * float(i);  // [-86, 0]
    double want = std::exp(double(x));
    worst = std::max(worst, std::abs(sb::kernels::cpu::exp_nonpos(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(sb::kernels::cpu::exp_nonpos(0.0f), 1.0f);
  EXPECT_EQ(sb::kernels::cpu::exp_nonpos(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(sb::kernels::cpu::exp_nonpos(-1e30f), 0.0f);
  EXPECT_LT(sb::kernels::cpu::exp_nonpos(-88.0f), 1e-37f);
}
