// Documents in parts in the plan (data.long_docs = "split", balance.split_docs): which documents are
// split, over how many ranks and where, and the plan balancing the rest around them (preload).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "src/balance/plan.hpp"
#include "tests/error_of.hpp"

namespace {

using Docs = std::vector<std::pair<uint64_t, uint64_t>>;

TEST(PartPlan, LongDocumentsLeaveTheBatchAndSpreadOverTheLeastLoadedRanks) {
  const sb::LatencyModel lm;
  Docs docs;
  for (uint64_t i = 0; i < 12; ++i) docs.push_back({i, 100});
  docs.push_back({100, 1000});  // over the capacity: ceil(1000 / 256) = 4 ranks at least
  docs.push_back({101, 600});   // 3 ranks at least
  std::vector<double> load;
  const auto groups = sb::place_long_docs(docs, 256, 8, sb::Batching::Tokens, lm, 4, 0, false, load);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(docs.size(), 12u);  // the short ones stay, in data order
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(docs[i].first, i);
  // Costliest first; fair share 2800 / 8 = 350 tokens: 1000 needs 3 by cost but 4 by memory.
  EXPECT_EQ(groups[0].doc, 100u);
  EXPECT_EQ(groups[0].ranks, 4);
  EXPECT_EQ(groups[0].first, 0);
  EXPECT_EQ(groups[1].doc, 101u);
  EXPECT_EQ(groups[1].ranks, 3);
  EXPECT_EQ(groups[1].first, 4);  // onto idle ranks, not on top of the first group
  EXPECT_DOUBLE_EQ(load[0], 250.0);
  EXPECT_DOUBLE_EQ(load[4], 200.0);
  EXPECT_DOUBLE_EQ(load[7], 0.0);
}

TEST(PartPlan, MoreRanksWhenOnePartWouldStillExceedTheFairShare) {
  const sb::LatencyModel lm;
  Docs docs = {{0, 2000}, {1, 50}, {2, 50}};  // fair share 2100 / 16 ~ 131 tokens
  std::vector<double> load;
  const auto groups = sb::place_long_docs(docs, 1024, 16, sb::Batching::Tokens, lm, 4, 0, false, load);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].ranks, 16);  // ceil(2000 / 131.25) = 16, not the 2 memory needs
}

TEST(PartPlan, PartDocsPartsCostlyDocumentsThatFit) {
  const sb::LatencyModel lm;
  const Docs batch = {{0, 900}, {1, 50}, {2, 50}, {3, 50}};  // all fit 1024; fair share 262.5 tokens
  Docs a = batch, b = batch;
  std::vector<double> la, lb;
  EXPECT_TRUE(sb::place_long_docs(a, 1024, 4, sb::Batching::Tokens, lm, 4, 0, false, la).empty());
  const auto g = sb::place_long_docs(b, 1024, 4, sb::Batching::Tokens, lm, 4, 0, true, lb);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].doc, 0u);
  EXPECT_EQ(g[0].ranks, 4);
  EXPECT_EQ(b.size(), 3u);
}

// balance.part_share: fitting documents above part x fair are split, each part within it.
TEST(PartPlan, PartPartPartsFittingDocumentsIntoSmallerParts) {
  const sb::LatencyModel lm;
  const Docs batch = {{0, 900}, {1, 500}, {2, 300}, {3, 200}, {4, 100}};  // fair share 2000 / 8 = 250 tokens
  Docs a = batch, b = batch;
  std::vector<double> la, lb;
  const auto ga = sb::place_long_docs(a, 1024, 8, sb::Batching::Tokens, lm, 4, 0, true, la);
  const auto gb = sb::place_long_docs(b, 1024, 8, sb::Batching::Tokens, lm, 4, 0, true, lb, 0.5);
  ASSERT_EQ(ga.size(), 3u);  // 900, 500 and 300 are above 250
  ASSERT_EQ(gb.size(), 4u);  // and 200 above 125
  EXPECT_EQ(b.size(), 1u);
  for (const auto& g : gb) EXPECT_LE(double(g.len) / g.ranks, 125.0) << "doc " << g.doc;
  EXPECT_EQ(ga[1].ranks, 2);  // 500 within 250
  EXPECT_EQ(gb[1].ranks, 4);  // 500 within 125
  EXPECT_EQ(gb[3].ranks, 4);  // 200 / 125 = 1.6, but 2 parts of 100 would end above the mean 250: grown
  // A group that would stack above the mean grows: 800 over 4 ranks (200 each), then 400 would be
  // 3 x 133 on top (333 > the mean 300); over 4 ranks it is 100 each, every rank at 300.
  Docs d = {{0, 800}, {1, 400}};
  std::vector<double> ld;
  const auto gd = sb::place_long_docs(d, 1024, 4, sb::Batching::Tokens, lm, 4, 0, true, ld, 0.5);
  ASSERT_EQ(gd.size(), 2u);
  EXPECT_EQ(gd[1].ranks, 4);
  EXPECT_EQ(ld, std::vector<double>(4, 300.0));
  Docs c = batch;
  const std::string m = sbtest::error_of([&] { sb::place_long_docs(c, 1024, 8, sb::Batching::Tokens, lm, 4, 0, true, lb, 0); });
  EXPECT_NE(m.find("balance.part_share"), std::string::npos) << m;
}

// The windows' segment tree picks what the plain scan picks: replaying the groups in placement
// order, each one's first rank is the lowest start of a least-busy window of its size.
TEST(PartPlan, WindowSearchMatchesThePlainScan) {
  const sb::LatencyModel lm;
  for (sb::Batching b : {sb::Batching::Tokens, sb::Batching::Sparse}) {
    Docs docs;
    uint64_t x = 12345;
    for (uint64_t i = 0; i < 400; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      docs.push_back({i, (i % 3 == 0 ? 300 : 20) + (x >> 33) % 900});
    }
    std::vector<double> load;
    const int R = 61;
    const auto groups = sb::place_long_docs(docs, 256, R, b, lm, 4, 64, true, load);
    ASSERT_GT(groups.size(), 20u);
    std::vector<double> ref(size_t(R), 0.0);
    std::vector<int> sizes;
    for (const auto& g : groups) {
      int first = -1;
      double best = 1e300;
      for (int s = 0; s + g.ranks <= R; ++s) {
        const double mx = *std::max_element(ref.begin() + s, ref.begin() + s + g.ranks);
        if (mx < best) best = mx, first = s;
      }
      EXPECT_EQ(g.first, first) << sb::batching_name(b) << " doc " << g.doc;
      const double c = sb::split_cost(b, lm, int64_t(g.len), g.ranks, 4, 64);
      for (int r = g.first; r < g.first + g.ranks; ++r) ref[size_t(r)] += c;
      sizes.push_back(g.ranks);
    }
    EXPECT_EQ(load, ref);
    std::sort(sizes.begin(), sizes.end());
    EXPECT_GT(std::unique(sizes.begin(), sizes.end()) - sizes.begin(), 2) << "several group sizes";
  }
}

TEST(PartPlan, TooFewRanksNamesHowManyAndTheKeys) {
  const sb::LatencyModel lm;
  Docs docs = {{7, 5000}};
  std::vector<double> load;
  const std::string m = sbtest::error_of([&] { sb::place_long_docs(docs, 1000, 4, sb::Batching::Sparse, lm, 4, 2048, false, load); });
  EXPECT_NE(m.find("document 7 has 5000 tokens"), std::string::npos) << m;
  EXPECT_NE(m.find("needs 5 ranks, and the run has 4"), std::string::npos) << m;
  EXPECT_NE(m.find("data.long_docs"), std::string::npos) << m;
  EXPECT_NE(m.find("train.micro_batch_tokens"), std::string::npos) << m;
}

TEST(PartPlan, ThePlanBalancesAroundThePreload) {
  const sb::LatencyModel lm;
  std::vector<sb::Segment> segs;
  for (uint64_t i = 0; i < 40; ++i) segs.push_back({i, 0, 100});
  const std::vector<double> preload = {2000, 0, 0, 0};  // rank 0 already holds a part worth 2000 tokens
  for (sb::Batching b : {sb::Batching::Tokens, sb::Batching::Sparse}) {
    const sb::Plan p = sb::make_plan(segs, 4, 4, 1024, b, lm, 4, {}, preload);
    std::vector<int64_t> tokens(4, 0);
    for (int r = 0; r < 4; ++r)
      for (const auto& mb : p.ranks[size_t(r)]) tokens[size_t(r)] += mb.tokens;
    EXPECT_EQ(std::accumulate(tokens.begin(), tokens.end(), int64_t(0)), 4000);
    EXPECT_EQ(tokens[0], 0) << sb::batching_name(b);  // already above what the others reach
    for (int r = 1; r < 4; ++r) EXPECT_NEAR(double(tokens[size_t(r)]), 4000.0 / 3, 100.0) << sb::batching_name(b);
  }
  EXPECT_NE(sbtest::error_of([&] { sb::make_plan(segs, 4, 4, 1024, sb::Batching::Tokens, lm, 4, {}, std::vector<double>(3)); }), "");
}

// A member's cost of a split document: with own-row gating (the CPU engine) the gating splits
// with the rows, one per-layer constant per member; with whole gating (CUDA) each pays it all, so
// its members are lighter.
TEST(PartPlan, OwnRowGatingSplitsTheGatingOverTheMembers) {
  sb::LatencyModel lm{sb::ModelShape{4, 64, 1}};
  lm.set_coeffs(sb::Part::Gating, {0.05, 1e-4, 2e-3});
  const int64_t len = 64 * 256;  // 256 blocks
  const double W = lm.segment_cost(len, 8), X = sb::part_exchange_ms(lm, len, 8, 512);
  const double gw = 4 * lm.part_ms(sb::Part::Gating, double(len), sb::LatencyModel::causal_blocks(len, 64));
  ASSERT_LT(gw, W);
  EXPECT_NEAR(sb::part_gating_ms(lm, len), gw, 1e-9 * gw);
  const double whole = sb::split_cost(sb::Batching::Sparse, lm, len, 8, 8, 512);
  EXPECT_NEAR(whole, (W - gw) / 8 + gw + X, 1e-9 * whole);
  lm.set_part_gating(sb::PartGating::OwnRows);
  EXPECT_NEAR(sb::part_gating_ms(lm, len), 4 * 0.05, 1e-12);
  const double own = sb::split_cost(sb::Batching::Sparse, lm, len, 8, 8, 512);
  EXPECT_NEAR(own, W / 8 + 4 * 0.05 + X, 1e-9 * own);
  EXPECT_LT(own, whole - 0.5 * gw);
  // The group a long document gets and its busiest member: lighter with own-row gating.
  Docs shorts;
  for (uint64_t i = 0; i < 60; ++i) shorts.push_back({i, 2000});
  shorts.push_back({100, uint64_t(len)});
  auto busiest = [&](sb::PartGating g) {
    lm.set_part_gating(g);
    Docs d = shorts;
    std::vector<double> load;
    const auto groups = sb::place_long_docs(d, 8192, 64, sb::Batching::Sparse, lm, 8, 512, false, load);
    EXPECT_EQ(groups.size(), 1u);
    EXPECT_GE(groups.empty() ? 0 : groups[0].ranks, 2);
    return *std::max_element(load.begin(), load.end());
  };
  EXPECT_LT(busiest(sb::PartGating::OwnRows), busiest(sb::PartGating::Whole));
}

// Whole documents that need a rank of their own (over 0.4 x the mean load) keep it while the groups
// are placed: a long document's group grows around them rather than leaving one of them no gap that
// fits it. 4 ranks, one micro-batch each: a 1,200-token document (2 members by memory) and three
// whole ones of 700 (mean 825). Groups first onto idle ranks put the third 700 beside a 600 part
// (1,300, 1.58x the mean: plain part at 64 x 1 was 1.085x the token-level bound so); around them
// the group takes all 4 ranks, 300 each, and the step is 1,000.
TEST(PartPlan, GroupsLeaveBigWholeDocumentsARankOfTheirOwn) {
  const sb::LatencyModel lm;
  const Docs batch = {{0, 700}, {1, 1200}, {2, 700}, {3, 700}};
  Docs docs = batch;
  std::vector<double> load;
  const auto groups = sb::place_long_docs(docs, 1000, 4, sb::Batching::Tokens, lm, 4, 0, false, load);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].doc, 1u);
  EXPECT_EQ(groups[0].ranks, 4);
  EXPECT_EQ(load, std::vector<double>(4, 300.0));  // the groups' load alone: the big documents are lifted
  ASSERT_EQ(docs.size(), 3u);
  const sb::Plan p = sb::make_plan(sb::make_segments(docs, 1000, false), 4, 1, 1000, sb::Batching::Tokens, lm, 4, {}, load);
  double top = 0;
  for (int r = 0; r < 4; ++r) {
    double t = load[size_t(r)];
    for (const auto& mb : p.ranks[size_t(r)]) t += double(mb.tokens);
    top = std::max(top, t);
  }
  EXPECT_EQ(top, 1000.0);
}

}  // namespace
