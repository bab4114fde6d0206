// Latency predictor: kept-block counts, fit, online correction, HDF5 round trip; recall model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "tests/restamp.hpp"
#include "io/h5.hpp"
#include "src/balance/latency_model.hpp"
#include "src/balance/recall_model.hpp"
#include "base/error.hpp"

using namespace sb;

TEST(Latency, KeptBlocksMatchesBruteForce) {
  for (int w : {0, 1, 3})
    for (int64_t len : {1, 63, 64, 65, 640, 5000})
      for (int k : {0, 1, 4, 100}) {
        LatencyModel lm(ModelShape{1, 64, w});
        int64_t nb = (len + 63) / 64;
        double kept = 0;
        for (int64_t i = 0; i < nb; ++i) {
          int64_t anchors = std::min<int64_t>(i + 1, w + 2);
          kept += double(anchors + std::min<int64_t>(k, i + 1 - anchors));
        }
        EXPECT_DOUBLE_EQ(lm.kept_blocks(len, k), kept) << "w " << w << " len " << len << " k " << k;
        EXPECT_LE(kept, LatencyModel::causal_blocks(len, 64));
      }
}

// Hybrid layers: a dense layer costs its attention over every causal block (what a sparse layer
// keeping everything costs) and no gating; segment_cost (SAB) counts the same.
TEST(Latency, DenseLayersCostDense) {
  LatencyModel lm{ModelShape{4, 64, 1}}, hyb{ModelShape{4, 64, 1}};
  for (LatencyModel* m : {&lm, &hyb}) m->set_coeffs(Part::Gating, {0, 1e-5, 1e-5});  // no constant: segment_cost has none
  hyb.set_dense_layers({0, 1, 0, 1});
  EXPECT_EQ(hyb.sparse_layers(), 2);
  EXPECT_DOUBLE_EQ(hyb.dense_share(), 0.5);
  const int64_t L = 5000;
  const MicroBatch one{{Segment{0, 0, uint64_t(L)}}, L};
  const std::vector<int> ks{8, 8, 8, 8};
  const PartTimes s = lm.micro_batch_parts(one, ks), h = hyb.micro_batch_parts(one, ks),
                  all = lm.micro_batch_parts(one, std::vector<int>{1 << 20, 1 << 20, 1 << 20, 1 << 20});
  EXPECT_NEAR(h.attention, s.attention / 2 + all.attention / 2, 1e-12 * h.attention);
  EXPECT_NEAR(h.gating, s.gating / 2, 1e-12 * h.gating);
  EXPECT_DOUBLE_EQ(h.linear, s.linear);
  EXPECT_NEAR(hyb.segment_cost(L, 8) - lm.segment_cost(L, 8), h.total() - s.total(), 1e-9 * h.total());
  EXPECT_GT(h.total(), s.total());
  EXPECT_THROW(hyb.set_dense_layers({1, 0}), Error);
}

TEST(Latency, FitRecoversCoefficients) {
  LatencyModel lm(ModelShape{4, 64, 1});
  std::mt19937_64 rng(3);
  auto u = [&] { return double(rng() >> 11) * 0x1.0p-53; };
  const double c0 = 0.3, c1 = 2e-4, c2 = 5e-7;
  std::vector<LatencySample> s;
  for (int i = 0; i < 60; ++i) {
    double tokens = 512 + u() * 16000, kept = (tokens / 64) * (2 + u() * 20) * 4096;
    double t = c0 + c1 * tokens + c2 * kept;
    s.push_back({tokens, kept, t * (1 + 0.01 * (2 * u() - 1))});
  }
  auto rep = lm.fit(Part::Attention, s);
  EXPECT_NEAR(rep.coeffs[0], c0, 0.1);
  EXPECT_NEAR(rep.coeffs[1] / c1, 1, 0.05);
  EXPECT_NEAR(rep.coeffs[2] / c2, 1, 0.03);
  EXPECT_LT(rep.heldout_error, 0.02);
  EXPECT_EQ(rep.samples, 60);
  std::vector<LatencySample> few = {{1, 0, 1}};
  EXPECT_THROW(lm.fit(Part::Linear, few), Error);
}

// Timings where the unconstrained fit has a negative slope (a large intercept, a flat or falling
// token term, as a fast, noisy GPU profile gives): the fit keeps every coefficient >= 0, so no
// document costs less than nothing, and still beats the best single feature.
TEST(Latency, FitKeepsCoefficientsNonNegative) {
  LatencyModel lm(ModelShape{4, 64, 1});
  std::vector<LatencySample> s;
  for (int i = 0; i < 40; ++i) {
    const double tokens = 1024.0 * (1 + i % 8), kept = tokens / 64 * (1 + i % 5) * 4096;
    s.push_back({tokens, kept, 2.0 - 1e-5 * tokens + 4e-8 * kept});  // falls with tokens
  }
  auto rep = lm.fit(Part::Attention, s);
  for (double c : rep.coeffs) EXPECT_GE(c, 0.0);
  EXPECT_GT(rep.coeffs[2], 0.0);
  EXPECT_GE(lm.segment_cost(1024, 2), 0.0);
  EXPECT_GT(lm.segment_cost(8192, 8), lm.segment_cost(1024, 2));
  EXPECT_LT(rep.heldout_error, 0.2);
}

TEST(Latency, OnlineCorrectionHealsInjectedSlowdown) {
  LatencyModel lm(ModelShape{4, 64, 1});
  lm.set_ema(0.3);
  MicroBatch mb{{Segment{0, 0, 8000}}, 8000};
  std::vector<int> ks(4, 8);
  // The machine's attention became 2x slower than the profile says.
  double truth = 0, err = 1;
  for (int step = 1; step <= 6; ++step) {
    PartTimes pred = lm.micro_batch_parts(mb, ks);
    PartTimes meas = pred;
    meas.attention = 2.0 * pred.attention / lm.correction(Part::Attention);
    truth = meas.attention;
    lm.observe(Part::Attention, pred.attention, meas.attention);
    lm.observe(Part::Linear, pred.linear, meas.linear);
    err = std::abs(lm.micro_batch_parts(mb, ks).attention - truth) / truth;
    if (step == 5) {
      EXPECT_LT(err, 0.10);
    }
  }
  EXPECT_NEAR(lm.correction(Part::Linear), 1.0, 1e-12);  // an accurate part stays put
  EXPECT_LT(err, 0.10);
  // Density: the gating keeps half the budgeted candidates.
  for (int i = 0; i < 10; ++i) lm.observe_density(100, 50);
  EXPECT_NEAR(lm.density(), 0.5, 0.02);
}

TEST(Latency, SaveLoadRoundTripAndShapeCheck) {
  LatencyModel lm(ModelShape{6, 64, 2});
  lm.set_device("test-cpu");
  lm.set_coeffs(Part::Gating, {0.1, 0.2, 0.3});
  lm.observe(Part::Attention, 1.0, 1.5);
  auto path = (std::filesystem::temp_directory_path() / "sb_latency_roundtrip.h5").string();
  {
    h5::Id f = h5::create(path);
    h5::Id g = h5::group(f, "latency", true);
    lm.save(g);
  }
  ModelShape same{6, 64, 2};
  LatencyModel back = LatencyModel::load_file(path, &same);
  EXPECT_EQ(back.profile().device, "test-cpu");
  EXPECT_EQ(back.shape().n_layers, 6); EXPECT_EQ(back.shape().local_blocks, 2);
  EXPECT_EQ(back.coeffs(Part::Gating), lm.coeffs(Part::Gating));
  EXPECT_DOUBLE_EQ(back.correction(Part::Attention), lm.correction(Part::Attention));
  MicroBatch mb{{Segment{0, 0, 3000}}, 3000};
  EXPECT_DOUBLE_EQ(back.micro_batch_ms(mb, 4), lm.micro_batch_ms(mb, 4));
  ModelShape other{6, 128, 2};
  try {
    LatencyModel::load_file(path, &other);
    FAIL() << "shape mismatch accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("block_size"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  EXPECT_THROW(LatencyModel::load_file("/nonexistent/p.h5"), Error);
  {  // a /latency group of another format: an error naming the file and the attribute
    h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    h5::Id g = h5::group(f, "latency", false);
    ASSERT_GE(H5Adelete(g, "format"), 0);
    h5::write_attr(g, "format", std::string("sparsebalance-metrics"));
  }
  sbtest::restamp(path);
  try {
    LatencyModel::load_file(path, &same);
    FAIL() << "foreign format accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path + ": attribute 'format' is \"sparsebalance-metrics\", expected \"sparsebalance-latency\" (not a latency profile)"),
              std::string::npos) << msg;
  }
  if (std::system("command -v h5dump >/dev/null 2>&1") == 0) {
    EXPECT_EQ(std::system(("h5dump -a /latency/device " + path + " >/dev/null").c_str()), 0);
  }
}

TEST(Recall, MatchesBruteForceAndLearnsAlpha) {
  ModelShape sh{2, 64, 1};
  RecallModel rm(sh, 0.5);
  for (int64_t len : {64, 1000, 20000, 700000})
    for (int k : {0, 3, 16}) {
      int64_t nb = (len + 63) / 64;
      double sum = 0;
      for (int64_t i = 0; i < nb; ++i) {
        double causal = double(i + 1), kept = std::min<double>(causal, 3 + k);
        sum += std::pow(kept / causal, 0.5);
      }
      EXPECT_NEAR(rm.recall(0, len, k), sum / double(nb), 2e-5) << len << " " << k;
    }
  EXPECT_DOUBLE_EQ(rm.recall(0, 100, 4), 1.0);  // short: dense
  EXPECT_LT(rm.recall(0, 20000, 4), rm.recall(0, 20000, 8));
  for (int i = 0; i < 30; ++i) rm.observe(1, 0.25, std::pow(0.25, 0.2));
  EXPECT_NEAR(rm.alpha(1), 0.2, 1e-3);
  EXPECT_DOUBLE_EQ(rm.alpha(0), 0.5);
}
