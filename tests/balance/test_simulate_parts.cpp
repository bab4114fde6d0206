// Documents in parts in `simulate` (issue 21): a modelled member holds the rows the trainer would
// give it (split_document, piece_batch) and DST costs and tunes them as the trainer does
// (build_items with the document's length).
#include <gtest/gtest.h>

#include "src/balance/simulate.hpp"

using namespace sb;

namespace {

constexpr int kLayers = 2, kBs = 64, kK0 = 8;

DstParams params() {
  DstParams p;
  p.k0 = kK0, p.max_change = 0.5, p.n_layers = kLayers;
  return p;
}

}  // namespace

// Each member's part is its pieces of the trainer's split, and simulate's predicted cost of it is
// the trainer's: its own rows' linear work and kept blocks of the whole document, plus the whole
// document's gating (every member gates it), at every budget, whatever else the rank holds.
TEST(SimulatePart, PartsAreTheTrainersRowsAndCosts) {
  const LatencyModel lm{ModelShape{kLayers, kBs, 1}};
  const RecallModel rm{ModelShape{kLayers, kBs, 1}};
  const DstParams p = params();
  const int64_t len = 96 * kBs + 10;  // a ragged last block
  const std::vector<PartGroup> groups{{5, uint64_t(len), 1, 3}};
  const SplitParts sp = split_parts(groups, 4, lm, kK0, 2048);
  ASSERT_EQ(sp.mbs.size(), 4u);
  EXPECT_TRUE(sp.mbs[0].empty());
  const auto pieces = split_document(len, 3, kBs, block_costs(len, kBs, true, kK0, 1, token_cost(lm)));
  const MicroBatch other{{{9, 0, 1000}}, 1000};  // a planned micro-batch before the part
  const double gating = kLayers * lm.part_ms(Part::Gating, double(len), LatencyModel::causal_blocks(len, kBs));
  int64_t tokens = 0;
  for (int m = 0; m < 3; ++m) {
    const size_t r = size_t(1 + m);
    ASSERT_EQ(sp.mbs[r].size(), 1u);
    const MicroBatch& part = sp.mbs[r][0];
    const MicroBatch want = piece_batch(5, pieces[size_t(m)]);
    ASSERT_EQ(part.segs.size(), want.segs.size());
    for (size_t i = 0; i < part.segs.size(); ++i) {
      EXPECT_EQ(part.segs[i].doc, 5u);
      EXPECT_EQ(part.segs[i].begin, want.segs[i].begin);
      EXPECT_EQ(part.segs[i].len, want.segs[i].len);
    }
    EXPECT_EQ(sp.doc_len[r][0], len);
    EXPECT_DOUBLE_EQ(sp.exchange_ms[r][0], part_exchange_ms(lm, len, 3, 2048));
    tokens += part.tokens;
    // As the trainer's predict(): the rank's micro-batches, then its part with the document's length.
    const std::vector<MicroBatch> mine{other, part};
    const std::vector<int64_t> doc_len{0, len};
    const DstItems it = build_items(mine, lm, rm, p, doc_len);
    for (int j = 0; j < it.n_steps; ++j) {
      const int k = it.ks[size_t(j)];
      double kept = 0;
      for (const Segment& s : part.segs)
        kept += lm.kept_blocks(int64_t(s.begin + s.len), k) - (s.begin ? lm.kept_blocks(int64_t(s.begin), k) : 0.0);
      const double want_ms = lm.part_ms(Part::Linear, double(part.tokens)) + gating +
                             kLayers * lm.part_ms(Part::Attention, double(part.tokens), kept * kBs * kBs);
      EXPECT_NEAR(item_ms(it, 1, std::vector<int>(kLayers, k)), want_ms, 1e-9 * want_ms) << "member " << m << " k " << k;
    }
  }
  EXPECT_EQ(tokens, len);
}

// simulate with tuning = dst moves the split parts' budgets off k0 (within max_change); with
// fixed they stay at k0.
TEST(SimulatePart, DstTunesTheSplitParts) {
  SimConfig c;
  c.ranks = 8, c.micro_batches = 1, c.steps = 1, c.capacity = 4096, c.max_len = 16384;
  c.split_long = true, c.split_docs = true, c.part_share = 0.3;
  c.dst = params();
  const LatencyModel lm{ModelShape{kLayers, kBs, 1}};
  const RecallModel rm{ModelShape{kLayers, kBs, 1}};
  const SimResult r = simulate(c, lm, rm);
  ASSERT_GT(r.split_per_step, 0);
  for (const PolicyResult& pr : r.policies) {
    if (pr.name == "sparse+fixed") {
      EXPECT_EQ(pr.part_k_lo, kK0);
      EXPECT_EQ(pr.part_k_hi, kK0);
    }
    if (pr.name == "sparse+dst") {
      EXPECT_TRUE(pr.part_k_lo < kK0 || pr.part_k_hi > kK0) << pr.part_k_lo << " " << pr.part_k_hi;
      EXPECT_GE(pr.part_k_lo, 4);
      EXPECT_LE(pr.part_k_hi, 12);
    }
  }
}

// A member's exchange moves the (G - 1) / G of the document it does not hold; a member's cost in the
// plan is its share of the document plus the whole document's gating (PartGating::Whole, the
// default: the CUDA engine) and the exchange.
TEST(SimulatePart, ExchangeAndGatingOfAMember) {
  const LatencyModel lm{ModelShape{kLayers, kBs, 1}};
  const int64_t len = 1 << 16;
  const double full = kLayers * 3.0 * lm.allreduce_ms(double(len) * 1024);
  EXPECT_EQ(part_exchange_ms(lm, len, 1, 1024), 0.0);
  EXPECT_DOUBLE_EQ(part_exchange_ms(lm, len, 2, 1024), kLayers * 3.0 * lm.allreduce_ms(double(len) * 512));
  EXPECT_LT(part_exchange_ms(lm, len, 8, 1024), full);
  const double W = lm.segment_cost(len, kK0), gate = part_gating_ms(lm, len);
  EXPECT_GT(gate, 0.0);
  for (int G : {2, 5})
    EXPECT_NEAR(split_cost(Batching::Sparse, lm, len, G, kK0, 1024), (W - gate) / G + gate + part_exchange_ms(lm, len, G, 1024), 1e-9 * W);
  EXPECT_DOUBLE_EQ(split_cost(Batching::Tokens, lm, len, 4, kK0, 1024), double(len) / 4);
}

// A group is sized on the step's mean load with its gating copies and exchange, not on the plain
// fair share of whole costs: a 256K document whose 5-member part is just above the fair share but
// within that mean gets 5 members, not 6 (one copy of its gating and of the exchange fewer).
TEST(SimulatePart, GroupsAreSizedOnTheMeanLoadWithTheirOverheads) {
  LatencyModel lm{ModelShape{32, 128, 1}};  // simulate's analytic model
  lm.set_coeffs(Part::Linear, {2, 80e-3, 0});
  lm.set_coeffs(Part::Attention, {0, 0, 560e-9});
  lm.set_coeffs(Part::Gating, {0, 0, 10e-6});
  const int64_t len = 262144, cap = 65536;
  const int R = 8;
  std::vector<std::pair<uint64_t, uint64_t>> docs{{0, uint64_t(len)}};
  double total = lm.segment_cost(len, 32);
  for (uint64_t i = 1; total < 72000; ++i) docs.push_back({i, 4096}), total += lm.segment_cost(4096, 32);
  const double fair = total / R;
  ASSERT_GT(split_cost(Batching::Sparse, lm, len, 5, 32, 2048), fair);  // the plain share asks for 6
  ASSERT_LT(split_cost(Batching::Sparse, lm, len, 6, 32, 2048), fair);
  std::vector<double> load;
  const auto groups = place_long_docs(docs, cap, R, Batching::Sparse, lm, 32, 2048, false, load);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].ranks, 5);
  EXPECT_DOUBLE_EQ(load[size_t(groups[0].first)], split_cost(Batching::Sparse, lm, len, 5, 32, 2048));
}

// Issue 21's must-show on the cell that regressed (bench/results/2026-12-01-parts-beside-big-docs.md, "Documents in parts beside big
// whole documents"): longalign up to 256K, 64 ranks x 1 micro-batch, plain part, simulate's
// analytic model and defaults: DST within 3% of the token-level bound at k0 (was 1.085x: a part and
// a 40K-token document on one rank, the groups placed first on idle ranks).
TEST(SimulatePart, PlainPartAtOneMicroBatchIsNearTheTokenBound) {
  LatencyModel lm{ModelShape{32, 128, 1}};  // simulate's analytic model
  lm.set_coeffs(Part::Linear, {2, 80e-3, 0});
  lm.set_coeffs(Part::Attention, {0, 0, 560e-9});
  lm.set_coeffs(Part::Gating, {0, 0, 10e-6});
  lm.set_ema(0.3);
  lm.set_part_gating(PartGating::OwnRows);  // train.device = cpu
  RecallModel rm{lm.shape(), 0.5, 0.3};
  for (int l = 0; l < 32; ++l) rm.set_alpha(l, 0.3 + 0.4 * l / 31);
  SimConfig c;
  c.ranks = 64, c.micro_batches = 1, c.steps = 2, c.max_len = 262144, c.split_long = true;
  c.dst.k0 = 32, c.dst.max_change = 0.2, c.dst.n_layers = 32;
  const SimResult r = simulate(c, lm, rm);
  const PolicyResult& dst = r.policies.back();
  ASSERT_EQ(dst.name, "sparse+dst");
  EXPECT_LT(dst.makespan, 1.03 * r.token_bound_k0);
  EXPECT_GT(r.whole_doc_bound, 3 * r.token_bound_k0);  // where the whole-document bound is far above it
}

// The split against Megatron's zigzag (equal-token chunks, member r taking r and 2G-1-r): never
// worse; for sparse rows, whose cost stops growing at the budget, zigzag gives the members holding
// the first chunks less work and the split balances it (for dense rows the split is zigzag).
// Work per member = the sum of its blocks' predicted costs (the costs the planner uses).
TEST(SimulatePart, SplitBalancesSparseWorkWhereZigzagDoesNot) {
  const LatencyModel lm{ModelShape{32, 128, 1}};
  const double tc = token_cost(lm);
  const int64_t len = 131072;
  for (const int G : {2, 4, 8}) {
    for (const bool sparse : {false, true}) {
      const std::vector<double> costs = block_costs(len, 128, sparse, 32, 1, tc);
      const std::vector<double> equal(costs.size(), 1.0);  // equal costs: the split is zigzag
      auto spread = [&](const std::vector<std::vector<Piece>>& parts) {
        double hi = 0, sum = 0;
        for (const auto& pieces : parts) {
          double w = 0;
          for (auto [b, e] : pieces)
            for (int32_t i = b / 128; i < (e + 127) / 128; ++i) w += costs[size_t(i)];
          hi = std::max(hi, w), sum += w;
        }
        return hi / (sum / double(parts.size()));  // max member / mean member
      };
      const double ours = spread(split_document(len, G, 128, costs));
      const double zigzag = spread(split_document(len, G, 128, equal));
      std::printf("G %d %s: max/mean work, split %.4f, zigzag %.4f\n", G, sparse ? "sparse" : "dense", ours, zigzag);
      EXPECT_LE(ours, zigzag + 1e-12) << "G " << G << (sparse ? " sparse" : " dense");
      EXPECT_LT(ours, 1.002) << "G " << G << (sparse ? " sparse" : " dense");
      if (sparse) {
        EXPECT_LT(ours, zigzag - 0.005) << "G " << G;  // zigzag under-loads the first chunks' members
      }
    }
  }
}
