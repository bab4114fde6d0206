// SAB (make_plan) and windowing (make_segments).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "src/balance/length_presets.hpp"
#include "src/balance/plan.hpp"
#include "tests/error_of.hpp"
#include "base/error.hpp"
#include "tests/balance/plan_reference.hpp"

using sbtest::error_of;

using namespace sb;

namespace {

std::vector<Segment> draw(Preset p, int n, int64_t max_len, uint64_t seed) {
  LengthSampler s(p, max_len, seed);
  std::vector<std::pair<uint64_t, uint64_t>> docs;
  for (int i = 0; i < n; ++i) docs.push_back({uint64_t(i), s.next()});
  return make_segments(docs, max_len, false);
}

// Every segment exactly once, capacity respected, tokens consistent.
void check_partition(const Plan& plan, std::span<const Segment> segs, int64_t cap) {
  std::map<std::pair<uint64_t, uint64_t>, int> seen;
  for (const auto& r : plan.ranks)
    for (const auto& mb : r) {
      int64_t t = 0;
      for (const auto& s : mb.segs) t += int64_t(s.len), seen[{s.doc, s.begin}]++;
      EXPECT_EQ(t, mb.tokens);
      EXPECT_LE(mb.tokens, cap);
      EXPECT_FALSE(mb.segs.empty());
    }
  EXPECT_EQ(seen.size(), segs.size());
  for (const auto& s : segs) EXPECT_EQ((seen[{s.doc, s.begin}]), 1) << "doc " << s.doc;
}

double rank_cost(const std::vector<MicroBatch>& r, const LatencyModel& lm, int k) {
  double c = 0;
  for (const auto& mb : r) c += lm.micro_batch_ms(mb, k);
  return c;
}

double makespan(const Plan& p, const LatencyModel& lm, int k) {
  double mx = 0;
  for (const auto& r : p.ranks) mx = std::max(mx, rank_cost(r, lm, k));
  return mx;
}


}  // namespace

TEST(Segments, WindowsLongDocuments) {
  std::vector<std::pair<uint64_t, uint64_t>> docs = {{7, 10}, {8, 0}, {9, 25}};
  auto segs = make_segments(docs, 10, false);
  ASSERT_EQ(segs.size(), 4u);
  EXPECT_EQ(segs[0].doc, 7u); EXPECT_EQ(segs[0].len, 10u);
  EXPECT_EQ(segs[1].doc, 9u); EXPECT_EQ(segs[1].begin, 0u); EXPECT_EQ(segs[1].len, 10u);
  EXPECT_EQ(segs[2].begin, 10u); EXPECT_EQ(segs[2].len, 10u);
  EXPECT_EQ(segs[3].begin, 20u); EXPECT_EQ(segs[3].len, 5u);
}

TEST(Segments, RejectNamesDocumentAndKeys) {
  std::vector<std::pair<uint64_t, uint64_t>> docs = {{1, 5}, {42, 5000}};
  auto msg = error_of([&] { make_segments(docs, 4096, true); });
  EXPECT_NE(msg.find("document 42"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4096"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.micro_batch_tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data.long_docs"), std::string::npos) << msg;
}

TEST(Plan, EveryPolicyPartitionsAndRespectsCapacity) {
  LatencyModel lm(ModelShape{4, 64, 1});
  const int64_t cap = 4096;
  auto segs = draw(Preset::LongAlign, 600, cap, 3);
  for (auto b : {Batching::Sequential, Batching::Tokens, Batching::Quadratic, Batching::Sparse}) {
    SCOPED_TRACE(batching_name(b));
    Plan p = make_plan(segs, 8, 4, cap, b, lm, 8);
    ASSERT_EQ(p.ranks.size(), 8u);
    check_partition(p, segs, cap);
    for (const auto& r : p.ranks) EXPECT_GE(r.size(), 1u);
    EXPECT_EQ(p.hash(), make_plan(segs, 8, 4, cap, b, lm, 8).hash());  // deterministic
  }
  EXPECT_EQ(parse_batching("sparse"), Batching::Sparse);
  EXPECT_NE(error_of([] { parse_batching("lpt"); }).find("balance.batching"), std::string::npos);
}

TEST(Plan, FewSegmentsAndOverflow) {
  LatencyModel lm(ModelShape{2, 32, 1});
  std::vector<Segment> two = {{0, 0, 100}, {1, 0, 50}};
  Plan p = make_plan(two, 4, 2, 128, Batching::Sparse, lm, 4);
  check_partition(p, two, 128);
  int empty = 0;
  for (const auto& r : p.ranks) empty += r.empty();
  EXPECT_EQ(empty, 2);
  // More tokens than ranks x micro-batches x capacity: extra micro-batches, nothing dropped.
  std::vector<Segment> many;
  for (int i = 0; i < 20; ++i) many.push_back({uint64_t(i), 0, 100});
  for (auto b : {Batching::Tokens, Batching::Sparse}) {
    Plan q = make_plan(many, 2, 2, 128, b, lm, 4);
    check_partition(q, many, 128);
    EXPECT_EQ(q.ranks[0].size() + q.ranks[1].size(), 20u);
  }
  std::vector<Segment> big = {{5, 0, 200}};
  EXPECT_NE(error_of([&] { make_plan(big, 1, 1, 128, Batching::Sparse, lm, 4); }).find("document 5"), std::string::npos);
}

// Sparse cost and token count disagree: one long sparse document is cheap per token, many short
// dense ones are not. Token LPT balances tokens and leaves the short-document rank slower.
TEST(Plan, SparseBeatsTokenLptWhenCostsDisagree) {
  LatencyModel lm(ModelShape{8, 64, 1});
  lm.set_coeffs(Part::Linear, {0, 1e-4, 0});
  lm.set_coeffs(Part::Attention, {0, 0, 1e-7});
  std::vector<Segment> segs;
  segs.push_back({0, 0, 16384});
  for (int i = 0; i < 64; ++i) segs.push_back({uint64_t(1 + i), 0, 512});
  const int k = 2;
  Plan tok = make_plan(segs, 2, 8, 16384, Batching::Tokens, lm, k);
  Plan sp = make_plan(segs, 2, 8, 16384, Batching::Sparse, lm, k);
  check_partition(sp, segs, 16384);
  double a = makespan(tok, lm, k), b = makespan(sp, lm, k);
  EXPECT_LT(b, a * 0.97) << "sparse " << b << " tokens " << a;
  // And the LPT + swaps result is close to the fluid bound.
  double total = rank_cost(sp.ranks[0], lm, k) + rank_cost(sp.ranks[1], lm, k);
  EXPECT_LT(b, 0.5 * total * 1.05);
}

TEST(Plan, SparseBalancesLongTailAtScale) {
  LatencyModel lm(ModelShape{32, 128, 1});
  // A global batch filling 90% of 32 ranks x 4 micro-batches x 64K, as `simulate` draws it.
  LengthSampler smp(Preset::LongAlign, 65536, 11);
  std::vector<std::pair<uint64_t, uint64_t>> docs;
  for (double tokens = 0; tokens < 0.9 * 32 * 4 * 65536;) docs.push_back({docs.size(), smp.next()}), tokens += double(docs.back().second);
  auto segs = make_segments(docs, 65536, false);
  Plan seq = make_plan(segs, 32, 4, 65536, Batching::Sequential, lm, 32);
  Plan sp = make_plan(segs, 32, 4, 65536, Batching::Sparse, lm, 32);
  check_partition(sp, segs, 65536);
  double total = 0, mx = 0;
  for (const auto& r : sp.ranks) {
    double c = rank_cost(r, lm, 32);
    total += c, mx = std::max(mx, c);
  }
  EXPECT_LT(mx / (total / 32), 1.02);
  EXPECT_LT(mx, makespan(seq, lm, 32));
}

// The fast planner (flat free-space arrays, in-place heap, lazy swap members, exact-size
// materialisation) makes exactly the plan of the original implementation, kept in
// plan_reference.hpp: same ranks, micro-batches and segment order (Plan::hash and a deep compare).
TEST(Plan, FastPlannerEqualsReference) {
  LatencyModel lm(ModelShape{8, 64, 1});
  struct Case { Preset preset; int docs, ranks, mbs; int64_t cap, max_len; uint64_t seed; };
  const Case cases[] = {
      {Preset::LongAlign, 600, 8, 4, 4096, 4096, 3},     // normal fill
      {Preset::LongAlign, 3000, 8, 4, 4096, 4096, 5},    // overflow: extra micro-batches
      {Preset::ChatQA2, 400, 16, 2, 2048, 8192, 7},      // windows of long documents
      {Preset::Uniform, 200, 3, 5, 1024, 1024, 9},
      {Preset::Fixed, 64, 8, 2, 1024, 1024, 1},          // all equal: ties everywhere
      {Preset::LongAlign, 20, 32, 4, 4096, 4096, 2},     // fewer segments than ranks
  };
  for (const auto& c : cases) {
    LengthSampler s(c.preset, c.max_len, c.seed);
    std::vector<std::pair<uint64_t, uint64_t>> docs;
    for (int i = 0; i < c.docs; ++i) docs.push_back({uint64_t(i), s.next()});
    auto segs = make_segments(docs, c.cap, false);
    for (auto b : {Batching::Sequential, Batching::Tokens, Batching::Quadratic, Batching::Sparse})
      for (int rounds : {0, 64}) {
        SCOPED_TRACE(std::string(batching_name(b)) + " docs " + std::to_string(c.docs) + " rounds " + std::to_string(rounds));
        PlanOptions o;
        o.swap_rounds = rounds;
        Plan fast = make_plan(segs, c.ranks, c.mbs, c.cap, b, lm, 4, o);
        Plan ref = ref::reference_make_plan(segs, c.ranks, c.mbs, c.cap, b, lm, 4, o);
        check_partition(fast, segs, c.cap);
        ASSERT_EQ(fast.ranks.size(), ref.ranks.size());
        for (size_t r = 0; r < ref.ranks.size(); ++r) {
          ASSERT_EQ(fast.ranks[r].size(), ref.ranks[r].size()) << "rank " << r;
          for (size_t m = 0; m < ref.ranks[r].size(); ++m) {
            EXPECT_EQ(fast.ranks[r][m].tokens, ref.ranks[r][m].tokens);
            ASSERT_EQ(fast.ranks[r][m].segs.size(), ref.ranks[r][m].segs.size());
            for (size_t j = 0; j < ref.ranks[r][m].segs.size(); ++j) {
              EXPECT_EQ(fast.ranks[r][m].segs[j].doc, ref.ranks[r][m].segs[j].doc);
              EXPECT_EQ(fast.ranks[r][m].segs[j].begin, ref.ranks[r][m].segs[j].begin);
            }
          }
        }
        EXPECT_EQ(fast.hash(), ref.hash());
      }
  }
}

// Two-level plan (PlanOptions::group_ranks): a partition like the one-level plan, balanced nearly as
// well, identical to the one-level plan with one group, and make_group_plan gives exactly the
// group's part of make_plan (what one rank computes for itself).
TEST(Plan, TwoLevelGroupsPartitionAndMatchMakePlan) {
  LatencyModel lm(ModelShape{32, 128, 1});
  LengthSampler smp(Preset::LongAlign, 65536, 11);
  std::vector<std::pair<uint64_t, uint64_t>> docs;
  const int R = 30, M = 4;  // groups of 8: 8, 8, 8 and a smaller last group of 6
  for (double tokens = 0; tokens < 0.9 * R * M * 65536;) docs.push_back({docs.size(), smp.next()}), tokens += double(docs.back().second);
  auto segs = make_segments(docs, 65536, false);
  for (auto b : {Batching::Tokens, Batching::Quadratic, Batching::Sparse}) {
    SCOPED_TRACE(batching_name(b));
    PlanOptions one, grouped;
    grouped.group_ranks = 8;
    Plan flat = make_plan(segs, R, M, 65536, b, lm, 32, one);
    Plan two = make_plan(segs, R, M, 65536, b, lm, 32, grouped);
    check_partition(two, segs, 65536);
    ASSERT_EQ(two.ranks.size(), size_t(R));
    double total = 0, mx = 0;
    for (const auto& r : two.ranks) {
      double c = rank_cost(r, lm, 32);
      total += c, mx = std::max(mx, c);
    }
    if (b == Batching::Sparse) {
      EXPECT_LT(mx / (total / R), 1.03);
    }
    EXPECT_LT(mx, makespan(flat, lm, 32) * 1.03) << "one-level " << makespan(flat, lm, 32) << " mean " << total / R;
    for (int rank : {0, 7, 8, 23, 24, 29}) {
      GroupPlan gp = make_group_plan(segs, R, M, 65536, b, lm, 32, grouped, rank);
      EXPECT_EQ(gp.first_rank, rank / 8 * 8);
      ASSERT_EQ(gp.ranks.size(), size_t(rank >= 24 ? 6 : 8));
      Plan part, whole;
      part.ranks = gp.ranks;
      whole.ranks.assign(two.ranks.begin() + gp.first_rank, two.ranks.begin() + gp.first_rank + int(gp.ranks.size()));
      EXPECT_EQ(part.hash(), whole.hash()) << "rank " << rank;
    }
    // One group (0, or at least the rank count) is the one-level plan.
    grouped.group_ranks = R;
    EXPECT_EQ(make_plan(segs, R, M, 65536, b, lm, 32, grouped).hash(), flat.hash());
    EXPECT_EQ(make_group_plan(segs, R, M, 65536, b, lm, 32, one, 5).ranks.size(), size_t(R));
  }
  PlanOptions bad;
  bad.group_ranks = -1;
  EXPECT_NE(error_of([&] { make_plan(segs, R, M, 65536, Batching::Sparse, lm, 32, bad); }).find("group_ranks"), std::string::npos);
}
