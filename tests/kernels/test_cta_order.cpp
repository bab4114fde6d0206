// CTA launch order of the attention kernels (kernels/cta_order.hpp): every order is a permutation
// with its defining sort, and the default (mixed) removes the tail of the head-outer order on the
// shapes that have one while leaving almost every item in head-outer order (L2 reuse); so does the
// variant the device builds (cta_order_bounded).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "kernels/cta_order.hpp"

namespace k = sb::kernels;

namespace {

// Causal triangle: block i costs i + 1 (a dense forward), the same for every head.
std::vector<int64_t> triangle(int nb, int nh) {
  std::vector<int64_t> w(size_t(nb) * nh);
  for (int i = 0; i < nb; i++)
    for (int h = 0; h < nh; h++) w[size_t(i) * nh + h] = i + 1;
  return w;
}

// Backward at density 0.1 with the mask: key block 0 is kept by every query block, block j
// by itself and ~10% of the later ones (random per head).
std::vector<int64_t> sink(int nb, int nh, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> w(size_t(nb) * nh);
  for (int j = 0; j < nb; j++)
    for (int h = 0; h < nh; h++) {
      int64_t c = 1;
      for (int i = j + 1; i < nb; i++) c += (j == 0) || (rng() % 10 == 0);
      w[size_t(j) * nh + h] = c;
    }
  return w;
}

double mean_load(const std::vector<int64_t>& w, int slots) {
  double t = 0;
  for (int64_t x : w) t += double(x);
  return t / slots;
}

}  // namespace

TEST(CtaOrder, EveryModeIsAPermutationWithItsSort) {
  std::mt19937 rng(7);
  const int nb = 37, nh = 6;
  std::vector<int64_t> w(size_t(nb) * nh);
  for (auto& x : w) x = 1 + int64_t(rng() % 50);
  for (auto mode : {k::CtaOrder::mixed, k::CtaOrder::heads, k::CtaOrder::blocks}) {
    const auto o = k::cta_order(w, nh, 16, mode);
    ASSERT_EQ(o.size(), w.size());
    std::vector<int> seen(w.size(), 0);
    for (int32_t x : o) seen.at(size_t(x))++;
    for (int s : seen) EXPECT_EQ(s, 1);
    for (size_t a = 1; a < o.size(); a++) {
      if (mode == k::CtaOrder::blocks) {
        EXPECT_GE(w[o[a - 1]], w[o[a]]);
      } else if (mode == k::CtaOrder::heads) {
        const int h0 = o[a - 1] % nh, h1 = o[a] % nh;
        EXPECT_LE(h0, h1);
        if (h0 == h1) {
          EXPECT_GE(w[o[a - 1]], w[o[a]]);
        }
      }
    }
  }
}

TEST(CtaOrder, MixedRemovesTheSinkTail) {
  const int nb = 64, nh = 32, slots = 132;  // 8K tokens, block 128, 32 heads, an H200
  const auto w = sink(nb, nh, 3);
  const double heads = k::list_makespan(w, k::cta_order(w, nh, slots, k::CtaOrder::heads), slots);
  const double mixed = k::list_makespan(w, k::cta_order(w, nh, slots, k::CtaOrder::mixed), slots);
  const double blocks = k::list_makespan(w, k::cta_order(w, nh, slots, k::CtaOrder::blocks), slots);
  const double bound = std::max(mean_load(w, slots), double(nb));  // key block 0 alone costs nb
  std::printf("bound %.1f heads %.1f mixed %.1f blocks %.1f\n", bound, heads, mixed, blocks);
  EXPECT_GT(heads, 1.3 * bound);  // the tail this order exists to remove
  EXPECT_LE(mixed, 1.05 * bound);
  EXPECT_LE(mixed, 1.05 * blocks);
}

TEST(CtaOrder, MixedKeepsTheHeadOrderOfADenseTriangle) {
  const int nb = 128, nh = 32, slots = 132;  // dense forward at 16K
  const auto w = triangle(nb, nh);
  const auto heads_o = k::cta_order(w, nh, slots, k::CtaOrder::heads);
  const auto mixed_o = k::cta_order(w, nh, slots, k::CtaOrder::mixed);
  const double heads = k::list_makespan(w, heads_o, slots), mixed = k::list_makespan(w, mixed_o, slots);
  const double bound = mean_load(w, slots);
  EXPECT_LE(mixed, 1.02 * bound);
  EXPECT_LE(mixed, heads);
  // the items moved to the front are few and all from the last heads; the rest keep head-outer order
  int moved = 0, early_head = nh;
  for (size_t a = 0; a < mixed_o.size() && mixed_o[a] != heads_o[0]; a++) {
    moved++;
    early_head = std::min(early_head, int(mixed_o[a] % nh));
  }
  EXPECT_LT(moved, int(w.size()) / 20);
  if (moved > 0) {
    EXPECT_GE(early_head, nh - 4);
  }
  std::vector<int32_t> rest(mixed_o.begin() + moved, mixed_o.end()), expect;
  for (int32_t x : heads_o)
    if (std::find(mixed_o.begin(), mixed_o.begin() + moved, x) == mixed_o.begin() + moved) expect.push_back(x);
  EXPECT_EQ(rest, expect);
}

// The device's variant of mixed (finish times bounded, not simulated): a permutation, the sink
// tail removed as mixed removes it, the dense triangle left almost in head-outer order.
TEST(CtaOrder, BoundedOrderBalancesAsMixedDoes) {
  const int slots = 132;
  for (const auto& [w, nh] : {std::pair{sink(64, 32, 3), 32}, std::pair{sink(256, 2, 5), 2}, std::pair{triangle(128, 32), 32},
                              std::pair{triangle(256, 10), 10}}) {
    const auto o = k::cta_order_bounded(w, nh, slots);
    ASSERT_EQ(o.size(), w.size());
    std::vector<int> seen(w.size(), 0);
    for (int32_t x : o) seen.at(size_t(x))++;
    for (int c : seen) EXPECT_EQ(c, 1);
    const double mixed = k::list_makespan(w, k::cta_order(w, nh, slots, k::CtaOrder::mixed), slots);
    const double bounded = k::list_makespan(w, o, slots);
    const auto heads_o = k::cta_order(w, nh, slots, k::CtaOrder::heads);
    size_t moved = 0;
    while (moved < o.size() && o[moved] != heads_o[0]) moved++;
    std::printf("items %zu: mixed %.1f bounded %.1f, %zu moved to the front\n", w.size(), mixed, bounded, moved);
    EXPECT_LE(bounded, 1.03 * mixed);
    EXPECT_LT(moved, w.size() / 4);
  }
}

TEST(CtaOrder, ParsesTheSwitch) {
  EXPECT_EQ(k::parse_cta_order(nullptr), k::CtaOrder::mixed);
  EXPECT_EQ(k::parse_cta_order(""), k::CtaOrder::mixed);
  EXPECT_EQ(k::parse_cta_order("mixed"), k::CtaOrder::mixed);
  EXPECT_EQ(k::parse_cta_order("heads"), k::CtaOrder::heads);
  EXPECT_EQ(k::parse_cta_order("blocks"), k::CtaOrder::blocks);
  try {
    k::parse_cta_order("Heads");
    FAIL() << "no error for order Heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("launch order 'Heads'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected mixed, heads or blocks"), std::string::npos) << e.what();
  }
}

TEST(CtaOrder, RejectsBadShapes) {
  EXPECT_THROW(k::cta_order({1, 2, 3}, 2, 4, k::CtaOrder::mixed), std::invalid_argument);
  EXPECT_THROW(k::cta_order({1, 2}, 0, 4, k::CtaOrder::mixed), std::invalid_argument);
  EXPECT_THROW(k::cta_order({1, 2}, 2, 0, k::CtaOrder::mixed), std::invalid_argument);
  EXPECT_TRUE(k::cta_order({}, 3, 4, k::CtaOrder::mixed).empty());
}
