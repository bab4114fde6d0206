// DST on documents in parts (context parallelism, build_items' doc_len): a rank's part of a document
// is costed as its rows of the whole document, and tuned per rank like a whole micro-batch.
#include <gtest/gtest.h>

#include <cmath>

#include "src/balance/dst_exchange.hpp"

using namespace sb;

namespace {

constexpr int kLayers = 2, kBs = 64;
constexpr int64_t kDoc = 64 * kBs;  // 64 blocks

// The pieces [b, e) of one document as a rank's micro-batch.
MicroBatch part(std::vector<std::pair<int64_t, int64_t>> pieces) {
  MicroBatch mb;
  for (auto [b, e] : pieces) mb.segs.push_back({7, uint64_t(b), uint64_t(e - b)}), mb.tokens += e - b;
  return mb;
}

DstParams params() {
  DstParams p;
  p.k0 = 8, p.max_change = 0.5, p.n_layers = kLayers;
  return p;
}

}  // namespace

// The members' parts add up to the whole document: attention (kept blocks) and recall at every
// budget; every member pays the whole document's gating (PartGating::Whole); a late piece costs what its rows keep, far
// more than a sequence of its length alone (what DST planned the parts on before).
TEST(DstPart, PartsAreCostedAsTheirRowsOfTheWholeDocument) {
  LatencyModel lm{ModelShape{kLayers, kBs, 1}};
  lm.set_coeffs(Part::Attention, {0, 0, 1});  // attention time = kept blocks x Bs^2: exact sums
  RecallModel rm{ModelShape{kLayers, kBs, 1}};
  rm.set_alpha(1, 0.8);
  const DstParams p = params();
  const std::vector<MicroBatch> whole{{{{7, 0, uint64_t(kDoc)}}, kDoc}};
  // Zigzag over 2 members: chunks 0 and 3 on member 0, 1 and 2 on member 1.
  const std::vector<MicroBatch> parts{part({{0, 16 * kBs}, {48 * kBs, kDoc}}), part({{16 * kBs, 48 * kBs}})};
  const std::vector<int64_t> len{kDoc, kDoc};
  const DstItems w = build_items(whole, lm, rm, p), s = build_items(parts, lm, rm, p, len);
  ASSERT_EQ(w.n_steps, s.n_steps);
  for (int j = 0; j < w.n_steps; ++j) {
    EXPECT_NEAR(s.attn_ms[size_t(j)] + s.attn_ms[size_t(s.n_steps + j)], w.attn_ms[size_t(j)], 1e-9 * w.attn_ms[size_t(j)]);
    for (int l = 0; l < kLayers; ++l) {
      const size_t at = size_t(l * w.n_steps + j), other = size_t((kLayers + l) * w.n_steps + j);
      EXPECT_NEAR(s.rec[at] + s.rec[other], w.rec[at], 1e-9 * w.rec[at]) << "layer " << l << " step " << j;
    }
  }
  const double gating = kLayers * lm.part_ms(Part::Gating, double(kDoc), LatencyModel::causal_blocks(kDoc, kBs));
  for (int m = 0; m < 2; ++m)
    EXPECT_NEAR(s.fixed_ms[size_t(m)], lm.part_ms(Part::Linear, double(parts[size_t(m)].tokens)) + gating, 1e-9 * gating);
  EXPECT_EQ(s.weight[0], double(32 * kBs * kLayers));
  // The last quarter alone as a sequence keeps fewer blocks than as the document's last rows, and
  // its recall is overestimated: the rows see a quarter of their causal blocks.
  const std::vector<MicroBatch> last{part({{48 * kBs, kDoc}})};
  const std::vector<int64_t> one{kDoc};
  const DstItems as_part = build_items(last, lm, rm, p, one), as_seq = build_items(last, lm, rm, p);
  EXPECT_GT(as_part.attn_ms[size_t(as_part.i0)], 1.2 * as_seq.attn_ms[size_t(as_seq.i0)]);
  EXPECT_LT(as_part.rec[size_t(as_part.i0)], as_seq.rec[size_t(as_seq.i0)]);
  EXPECT_THROW(build_items(parts, lm, rm, p, one), std::logic_error);
}

// Own-row gating (the CPU engine, PartGating::OwnRows): each member's gating is its rows' causal
// pairs, and the members' gating adds up to one whole document's but for the per-layer constant
// each pays; with Whole every member pays all of it (the CUDA engine).
TEST(DstPart, OwnRowGatingCostsEachMemberItsRowsOnly) {
  LatencyModel lm{ModelShape{kLayers, kBs, 1}};
  lm.set_coeffs(Part::Gating, {0.5, 1e-3, 0.25});
  RecallModel rm{ModelShape{kLayers, kBs, 1}};
  const DstParams p = params();
  const std::vector<MicroBatch> parts{part({{0, 16 * kBs}, {48 * kBs, kDoc}}), part({{16 * kBs, 48 * kBs}})};
  const std::vector<int64_t> len{kDoc, kDoc};
  const DstItems whole = build_items(parts, lm, rm, p, len);
  lm.set_part_gating(PartGating::OwnRows);
  const DstItems own = build_items(parts, lm, rm, p, len);
  const double all = kLayers * lm.part_ms(Part::Gating, double(kDoc), LatencyModel::causal_blocks(kDoc, kBs));
  double sum = 0;
  for (int m = 0; m < 2; ++m) {
    const double linear = lm.part_ms(Part::Linear, double(parts[size_t(m)].tokens));
    EXPECT_NEAR(whole.fixed_ms[size_t(m)] - linear, all, 1e-9 * all);
    sum += own.fixed_ms[size_t(m)] - linear;
    EXPECT_LT(own.fixed_ms[size_t(m)] - linear, 0.8 * all);
    EXPECT_EQ(own.attn_ms, whole.attn_ms);  // only the gating changes
  }
  EXPECT_NEAR(sum, all + kLayers * 0.5, 1e-9 * all);
  // Member 1 holds the middle half: rows of blocks 16..47, (17 + ... + 48) causal pairs.
  const double mid = kLayers * lm.part_ms(Part::Gating, 32.0 * kBs, (17 + 48) * 32 / 2.0);
  EXPECT_NEAR(own.fixed_ms[1] - lm.part_ms(Part::Linear, 32.0 * kBs), mid, 1e-9 * mid);
}

// Two ranks share a document; rank 0 also holds a long micro-batch of its own. The lighter rank 1
// would wait at the barrier: it raises its part's budgets, rank 0 lowers its own (both within
// max_change); with tuning = "fixed" every part stays at k0.
TEST(DstPart, PartsAreTunedPerRankTowardTheTarget) {
  LatencyModel lm{ModelShape{kLayers, kBs, 1}};
  RecallModel rm{ModelShape{kLayers, kBs, 1}};
  DstParams p = params();
  const std::vector<std::vector<MicroBatch>> ranks{
      {{{{3, 0, uint64_t(kDoc / 2)}}, kDoc / 2}, part({{0, 16 * kBs}, {48 * kBs, kDoc}})},
      {part({{16 * kBs, 48 * kBs}})}};
  const std::vector<std::vector<int64_t>> len{{0, kDoc}, {kDoc}};
  for (Tuning t : {Tuning::Dst, Tuning::Fixed}) {
    p.tuning = t;
    std::vector<DstItems> items;
    std::vector<RankSummary> sums;
    for (int r = 0; r < 2; ++r) items.push_back(build_items(ranks[size_t(r)], lm, rm, p, len[size_t(r)]));
    for (const auto& it : items) sums.push_back(summarize(it, p));
    ASSERT_GT(sums[0].ms_k0, sums[1].ms_k0);
    const TuneResult r0 = tune(DstInput{sums, items[0]}, 0, p), r1 = tune(DstInput{sums, items[1]}, 1, p);
    int up = 0, down = 0;
    for (int l = 0; l < kLayers; ++l) {
      const int a = r0.k[1][size_t(l)], b = r1.k[0][size_t(l)];  // the parts' budgets
      EXPECT_GE(a, 4);  // k0 (1 -+ max_change)
      EXPECT_LE(b, 12);
      EXPECT_LE(a, p.k0);
      EXPECT_GE(b, p.k0);
      if (t == Tuning::Fixed) {
        EXPECT_EQ(a, p.k0);
        EXPECT_EQ(b, p.k0);
      }
      down += a < p.k0, up += b > p.k0;
    }
    if (t == Tuning::Dst) {
      EXPECT_GT(up, 0);
      EXPECT_GT(down, 0);
      EXPECT_LE(r1.my_predicted_ms, r1.target_ms * (1 + 1e-9));
      EXPECT_GT(r1.my_predicted_ms, sums[1].ms_k0);
    }
  }
}
