// The whole model: gradients against finite differences (float64), sparse-with-everything-kept
// equals dense, HF parameter names and shapes, optimizer and schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>

#include "src/model/decode.hpp"
#include "src/model/model.hpp"
#include "src/config/config.hpp"
#include "src/train/settings.hpp"
#include "src/engine/update.hpp"
#include "tests/train/model_test_util.hpp"

using namespace sb;

namespace {

using sbtest::random_batch;
using sbtest::tiny_dims;

AttnSettings settings(bool sparse, int layers, int k) {
  AttnSettings a;
  a.sparse = sparse, a.block_size = 4, a.local_blocks = 1, a.theta = 1e9;
  a.k.assign(layers, k);
  return a;
}

// Central differences of the summed loss against the analytic gradient, on a random sample of
// parameters of every tensor.
// dense: attention.dense_layers' flags (empty: none); mode: the gate's (query, key, sub-blocks).
void check_gradients(const ModelDims& dims, bool sparse, ModelExec exec = {}, std::vector<uint8_t> dense = {},
                     kernels::GatingParams mode = {0, 0, 0}) {
  Model<double> m(dims);
  m.set_exec(exec);
  m.init(7);
  std::mt19937_64 brng(5);
  for (const auto& p : m.params()) {  // biases start at 0 and q/k norms at 1: give them values so they matter
    const bool qk = p.name.ends_with("q_norm.weight") || p.name.ends_with("k_norm.weight");
    if (p.name.ends_with(".bias") || qk)
      for (size_t i = 0; i < p.size; ++i)
        m.weights()[p.offset + i] = (qk ? 1.0 : 0.0) + double(brng() % 1000) / 1000.0 - 0.5;
  }
  PackedBatch b = random_batch({13, 5, 21}, m.shape().vocab, 3);
  AttnSettings a = settings(sparse, m.shape().n_layers, 1);
  a.dense = dense, a.gate_query = mode.query, a.gate_key = mode.key, a.gate_sub_blocks = mode.sub_blocks;
  m.zero_grads();
  m.forward_backward(b, a, 1.0);
  std::vector<double> g = m.grads();
  std::mt19937_64 rng(11);
  const double h = 1e-5;
  for (const auto& p : m.params()) {
    double worst = 0;
    for (int trial = 0; trial < 6; ++trial) {
      size_t i = p.offset + rng() % p.size;
      double w0 = m.weights()[i];
      m.weights()[i] = w0 + h;
      double lp = m.forward(b, a).loss_sum;
      m.weights()[i] = w0 - h;
      double lm = m.forward(b, a).loss_sum;
      m.weights()[i] = w0;
      double fd = (lp - lm) / (2 * h);
      worst = std::max(worst, std::abs(fd - g[i]) / std::max(1e-6, std::abs(fd) + std::abs(g[i])));
    }
    EXPECT_LT(worst, 1e-6) << p.name << (sparse ? " (sparse)" : " (dense)");
  }
}
void check_gradients(bool sparse, bool tied, bool qkv_bias = false, ModelExec exec = {}, std::vector<uint8_t> dense = {},
                     kernels::GatingParams mode = {0, 0, 0}) {
  check_gradients(tiny_dims(tied, qkv_bias), sparse, exec, std::move(dense), mode);
}

// Qwen3's shape: head_dim 6 decoupled from d_model / n_heads = 4, q_norm / k_norm, and a scaled RoPE
// whose original context (8) the sequences pass.
ModelDims qwen3_dims(const std::string& rope) {
  ModelDims d = tiny_dims(true);
  d.head_dim = 6, d.qk_norm = true;
  d.rope_scaling.type = rope;
  d.rope_scaling.factor = 4, d.rope_scaling.original_max_positions = 8;
  d.rope_theta = 100;
  return d;
}

}  // namespace

TEST(Model, GradientsMatchFiniteDifferencesDense) { check_gradients(false, true); }
TEST(Model, GradientsMatchFiniteDifferencesSparseUntied) { check_gradients(true, false); }
TEST(Model, GradientsMatchFiniteDifferencesQkvBias) {
  check_gradients(false, true, true);
  check_gradients(true, false, true);
}

TEST(Model, GradientsMatchFiniteDifferencesQwen3ScaledRope) {
  check_gradients(qwen3_dims("yarn"), false);                       // attention factor 1.139 on q and k
  check_gradients(qwen3_dims("llama3"), true);
  check_gradients(qwen3_dims("linear"), false, ModelExec{0, true});  // and through recomputation
}

TEST(Model, QkNormNamesShapesAndEffect) {
  const ModelDims d = qwen3_dims("none");
  Model<double> m(d);
  EXPECT_EQ(m.param("model.layers.1.self_attn.q_norm.weight").shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(m.param("model.layers.0.self_attn.k_norm.weight").shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(m.param("model.layers.0.self_attn.q_proj.weight").shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(m.param("model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{16, 24}));
  EXPECT_FALSE(m.param("model.layers.0.self_attn.q_norm.weight").decay);
  EXPECT_EQ(int64_t(m.weights().size()), d.num_params());
  // q, k, v adjacent (the GPU's packed projection); the norms inside the layer's range
  const auto& q = m.param("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(m.param("model.layers.0.self_attn.k_proj.weight").offset, q.offset + q.size);
  auto [lo, hi] = m.layout().layer_range(0);
  EXPECT_LT(m.param("model.layers.0.self_attn.k_norm.weight").offset, hi);
  EXPECT_EQ(hi, m.layout().layer_range(1).first);
  // The norms act: a k_norm weight changes the loss; an all-scaled q_norm weight does too (q's scale
  // is not softmax-invariant).
  m.init(3);
  PackedBatch b = random_batch({17, 9}, d.vocab, 4);
  AttnSettings a = settings(false, d.n_layers, 0);
  const double l0 = m.forward(b, a).loss_sum;
  m.weights()[m.param("model.layers.0.self_attn.k_norm.weight").offset + 1] = 1.7;
  EXPECT_GT(std::abs(m.forward(b, a).loss_sum - l0), 1e-6);
}

TEST(Model, RopeTablesFollowTransformersFormulas) {
  // llama3 (Llama 3.1: factor 8, 1, 4, 8192; head 128, theta 500000): the three bands.
  RopeScaling r;
  r.type = "llama3", r.factor = 8, r.original_max_positions = 8192;
  const RopeTable t = rope_table(128, 500000, r);
  const auto plain = kernels::rope_plain_inv_freq(128, 500000);
  ASSERT_EQ(t.inv_freq.size(), 64u);
  EXPECT_EQ(t.scale, 1.0);
  for (size_t d = 0; d < 64; ++d) {
    const double wl = 2 * std::numbers::pi / plain[d];
    if (wl < 8192 / 4.0) EXPECT_DOUBLE_EQ(t.inv_freq[d], plain[d]) << d;          // high frequencies kept
    else if (wl > 8192) EXPECT_DOUBLE_EQ(t.inv_freq[d], plain[d] / 8) << d;       // low ones divided
    else EXPECT_TRUE(t.inv_freq[d] < plain[d] && t.inv_freq[d] > plain[d] / 8) << d;  // blended
  }
  // yarn (Qwen2.5: factor 4, original 32768; head 128, theta 1e6): ramp bounds floor(23.6) = 23 and
  // ceil(39.65) = 40 (find_correction_dim), attention factor 0.1 ln 4 + 1.
  r = RopeScaling{};
  r.type = "yarn", r.factor = 4, r.original_max_positions = 32768;
  const RopeTable y = rope_table(128, 1e6, r);
  const auto p6 = kernels::rope_plain_inv_freq(128, 1e6);
  EXPECT_DOUBLE_EQ(y.scale, 0.1 * std::log(4.0) + 1);
  for (int d : {0, 10, 23}) EXPECT_DOUBLE_EQ(y.inv_freq[d], p6[d]) << d;
  for (int d : {40, 50, 63}) EXPECT_DOUBLE_EQ(y.inv_freq[d], p6[d] / 4) << d;
  const double ramp = (30 - 23) / double(40 - 23);
  EXPECT_NEAR(y.inv_freq[30], p6[30] / 4 * ramp + p6[30] * (1 - ramp), 1e-18);
  r.attention_factor = 1.5;
  EXPECT_EQ(rope_table(128, 1e6, r).scale, 1.5);
  // linear: every frequency divided
  r = RopeScaling{};
  r.type = "linear", r.factor = 2;
  const RopeTable lt = rope_table(8, 1e4, r);
  for (int d = 0; d < 4; ++d) EXPECT_DOUBLE_EQ(lt.inv_freq[d], kernels::rope_plain_inv_freq(8, 1e4)[d] / 2);
}

TEST(Model, QkvBiasNamesShapesAndEffect) {
  ModelDims d = tiny_dims(true, true);
  Model<double> m(d);
  EXPECT_EQ(m.param("model.layers.1.self_attn.q_proj.bias").shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(m.param("model.layers.1.self_attn.k_proj.bias").shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(m.param("model.layers.0.self_attn.v_proj.bias").shape, (std::vector<int64_t>{8}));
  EXPECT_FALSE(m.param("model.layers.0.self_attn.v_proj.bias").decay);
  EXPECT_THROW(m.param("model.layers.0.self_attn.o_proj.bias"), std::exception);
  EXPECT_EQ(int64_t(m.weights().size()), d.num_params());
  EXPECT_EQ(d.num_params(), tiny_dims(true).num_params() + 2 * (16 + 8 + 8));
  // layer_range covers the biases, and layers stay contiguous
  auto [lo, hi] = m.layout().layer_range(0);
  EXPECT_EQ(hi, m.layout().layer_range(1).first);
  EXPECT_GE(m.param("model.layers.0.self_attn.q_proj.bias").offset, lo);
  // Zero biases give exactly the bias-free model; a k bias changes the loss (it is not softmax-invariant
  // once RoPE rotates it), and so does a v bias.
  m.init(3);
  Model<double> plain(tiny_dims(true));
  plain.init(3);
  for (const auto& p : plain.params())
    std::copy_n(plain.weights().begin() + long(p.offset), p.size, m.weights().begin() + long(m.param(p.name).offset));
  PackedBatch b = random_batch({17, 9}, d.vocab, 4);
  AttnSettings a = settings(false, d.n_layers, 0);
  EXPECT_DOUBLE_EQ(m.forward(b, a).loss_sum, plain.forward(b, a).loss_sum);
  m.weights()[m.param("model.layers.0.self_attn.v_proj.bias").offset] = 0.5;
  EXPECT_GT(std::abs(m.forward(b, a).loss_sum - plain.forward(b, a).loss_sum), 1e-6);
}

// The chunked LM head (5 tokens per chunk over 39, the last chunk partial) and recomputation.
TEST(Model, GradientsMatchFiniteDifferencesChunkedHead) { check_gradients(true, true, false, ModelExec{5, false}); }

// Chunked and whole LM head give the same loss, gradients and predictions, with masked targets
// (the loss mask: -1 targets) inside and across chunks.
TEST(Model, ChunkedLmHeadEqualsWhole) {
  Model<double> m(tiny_dims(false));
  m.init(3);
  PackedBatch b = random_batch({13, 5, 21}, m.shape().vocab, 4);
  for (int t : {0, 1, 2, 7, 20, 21, 22, 23, 24, 25}) b.targets[size_t(t)] = -1;
  const AttnSettings a = settings(true, m.shape().n_layers, 1);
  auto run = [&](int chunk, std::vector<int32_t>* am) {
    m.set_exec(ModelExec{chunk, false});
    m.zero_grads();
    auto st = m.forward_backward(b, a, 0.03);
    m.forward(b, a, am);
    return std::pair{st, m.grads()};
  };
  std::vector<int32_t> am0, am;
  auto [st0, g0] = run(0, &am0);
  for (int chunk : {1, 5, 16, 39, 100}) {
    auto [st, g] = run(chunk, &am);
    EXPECT_EQ(st.targets, st0.targets);
    EXPECT_EQ(st.correct, st0.correct);
    EXPECT_NEAR(st.loss_sum, st0.loss_sum, 1e-12 * st0.loss_sum) << "chunk " << chunk;
    EXPECT_EQ(am, am0) << "chunk " << chunk;
    double worst = 0, norm = 0;
    for (size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(g[i] - g0[i])), norm = std::max(norm, std::abs(g0[i]));
    EXPECT_LT(worst, 1e-12 * norm) << "chunk " << chunk;
  }
  EXPECT_EQ(st0.targets, 39 - 3 - 10);  // 3 document ends, 10 masked (7 of them inside documents)
}

// model.lm_head_chunk = 0 picks the chunk: whole when the logits (fp32; bf16 on the GPU) fit in 1 GiB (a byte vocabulary,
// or 32K at 8K tokens), else the most rows that fit, a multiple of 128 (Qwen's 151,936: 1,664).
TEST(Model, AutoLmHeadChunkBoundsTheLogits) {
  const ModelExec a{0, false};
  EXPECT_EQ(a.head_rows(16384, 259), 16384);
  EXPECT_EQ(a.head_rows(8192, 32768), 8192);
  EXPECT_EQ(a.head_rows(16384, 32768), 8192);
  EXPECT_EQ(a.head_rows(16384, 151936), 1664);
  EXPECT_EQ(a.head_rows(16384, 151936, 2), 3456);  // the GPU's bf16 logits: twice the tokens
  EXPECT_EQ(a.head_rows(16384, 32768, 2), 16384);
  EXPECT_LE(int64_t(a.head_rows(131072, 151936)) * 151936 * 4, ModelExec::kAutoHeadBytes);
  EXPECT_EQ(a.head_rows(100, 1 << 30), 100);  // never below 128 rows, never above N
  EXPECT_EQ(a.head_rows(1000, 1 << 30), 128);
  EXPECT_EQ((ModelExec{7, false}.head_rows(16384, 151936)), 7);  // set: taken as given
  EXPECT_EQ((ModelExec{7, false}.head_rows(5, 151936)), 5);
}

TEST(Model, GradientsMatchFiniteDifferencesRecomputeUntied) { check_gradients(false, false, false, ModelExec{0, true}); }

// train.recompute = "layer": the same loss, statistics and gradients, bit for bit (the same kernels
// on the same inputs), sparse and dense, together with the chunked head.
TEST(Model, LayerRecomputationEqualsStoredActivations) {
  for (bool sparse : {true, false}) {
    Model<double> m(tiny_dims(true));
    m.init(13);
    PackedBatch b = random_batch({30, 7, 19}, m.shape().vocab, 6);
    const AttnSettings a = settings(sparse, m.shape().n_layers, 1);
    auto run = [&](ModelExec e) {
      m.set_exec(e);
      m.zero_grads();
      auto st = m.forward_backward(b, a, 0.05);
      return std::pair{st, m.grads()};
    };
    auto [s0, g0] = run({0, false});
    auto [s1, g1] = run({0, true});
    auto [s2, g2] = run({8, true});
    EXPECT_EQ(s1.loss_sum, s0.loss_sum);
    EXPECT_EQ(s1.gating[1].kept_blocks, s0.gating[1].kept_blocks);
    EXPECT_TRUE(g1 == g0) << "recomputed gradients differ, sparse " << sparse;
    EXPECT_NEAR(s2.loss_sum, s0.loss_sum, 1e-12 * s0.loss_sum);
    double worst = 0;
    for (size_t i = 0; i < g0.size(); ++i) worst = std::max(worst, std::abs(g2[i] - g0[i]));
    EXPECT_LT(worst, 1e-12);
  }
}

TEST(Model, SparseWithEveryBlockKeptEqualsDense) {
  Model<double> m(tiny_dims(true));
  m.init(5);
  PackedBatch b = random_batch({40, 9, 33}, m.shape().vocab, 9);
  double dense = m.forward(b, settings(false, 2, 0)).loss_sum;
  auto st = m.forward(b, settings(true, 2, 1000));
  EXPECT_NEAR(st.loss_sum, dense, 1e-10 * std::abs(dense));
  EXPECT_DOUBLE_EQ(st.gating[0].density(), 1.0);
  // A small budget really drops blocks and changes the result.
  auto sp = m.forward(b, settings(true, 2, 0));
  EXPECT_LT(sp.gating[0].density(), 0.9);
  EXPECT_GT(std::abs(sp.loss_sum - dense), 1e-6);
}

// Hybrid layers (attention.dense_layers): the dense layer keeps every causal block (density and
// recall 1) while the sparse one drops blocks; a dense layer is exactly that layer gated with every
// block kept; every layer dense is the dense model; the gate modes reach the model's gating.
TEST(Model, DenseLayersAttendDenselyInASparseRun) {
  Model<double> m(tiny_dims(true));
  m.init(5);
  PackedBatch b = random_batch({40, 9, 33}, m.shape().vocab, 9);
  const double dense = m.forward(b, settings(false, 2, 0)).loss_sum;
  AttnSettings hyb = settings(true, 2, 0);
  hyb.dense = {0, 1};
  const MicroBatchStats st = m.forward(b, hyb);
  EXPECT_LT(st.gating[0].density(), 0.9);
  EXPECT_DOUBLE_EQ(st.gating[1].density(), 1.0);
  EXPECT_DOUBLE_EQ(st.gating[1].recall(), 1.0);
  AttnSettings kept = settings(true, 2, 0);
  kept.k = {0, 1000};  // layer 1 gated, every block kept: the same blocks as dense
  EXPECT_NEAR(st.loss_sum, m.forward(b, kept).loss_sum, 1e-12 * std::abs(dense));
  EXPECT_GT(std::abs(st.loss_sum - m.forward(b, settings(true, 2, 0)).loss_sum), 1e-6) << "the dense layer changes the result";
  hyb.dense = {1, 1};
  EXPECT_NEAR(m.forward(b, hyb).loss_sum, dense, 1e-10 * std::abs(dense));
  // the gate modes: each keeps other blocks than the mean gate on this batch at a budget of 1
  AttnSettings mean = settings(true, 2, 1);
  mean.theta = 1e9;
  const double base = m.forward(b, mean).loss_sum;
  int differ = 0;
  for (auto [q, k] : {std::pair{kernels::GateQuery::max, kernels::GateKey::mean},
                      std::pair{kernels::GateQuery::mean, kernels::GateKey::bounds},
                      std::pair{kernels::GateQuery::mean, kernels::GateKey::sub}}) {
    AttnSettings a = mean;
    a.gate_query = q, a.gate_key = k, a.gate_sub_blocks = 2;
    differ += std::abs(m.forward(b, a).loss_sum - base) > 1e-9;
  }
  EXPECT_GE(differ, 2) << "the gate modes should change the kept blocks";
  AttnSettings bad = settings(true, 2, 1);
  bad.dense = {1};
  EXPECT_THROW(m.forward(b, bad), std::logic_error) << "one flag per layer";
}

TEST(Model, GradientsMatchFiniteDifferencesHybridLayers) {
  check_gradients(true, true, false, {}, {0, 1});
  check_gradients(true, false, false, ModelExec{0, true}, {1, 0}, {0, 0, 0, kernels::GateQuery::max, kernels::GateKey::bounds});
}

// The config's gate and hybrid-layer keys: parsed into the attention settings; bad values refused
// with the key, the item and the range named.
TEST(Model, GateAndDenseLayerKeys) {
  EXPECT_EQ(parse_dense_layers("", 8, "model.n_layers"), std::vector<uint8_t>{});
  EXPECT_EQ(parse_dense_layers("last:3", 8, "model.n_layers"), (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(parse_dense_layers("0, 5,last:1", 8, "model.n_layers"), (std::vector<uint8_t>{1, 0, 0, 0, 0, 1, 0, 1}));
  auto msg = [](const std::string& text) {
    try {
      parse_dense_layers(text, 8, "model.n_layers");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("0,8").find("attention.dense_layers = \"0,8\": \"8\" is outside the layers 0..7 (model.n_layers = 8)"),
            std::string::npos) << msg("0,8");
  EXPECT_NE(msg("last:9").find("expected 1..8"), std::string::npos) << msg("last:9");
  EXPECT_NE(msg("last:0").find("expected 1..8"), std::string::npos) << msg("last:0");
  for (const char* bad : {"-1", "a", "1,,2", "last:", "3,"})
    EXPECT_NE(msg(bad).find("is not a layer index or last:N"), std::string::npos) << bad << ": " << msg(bad);
  Config c;
  c.set("model.n_layers", "4", "test");
  c.set("attention.gate_query", "max", "test");
  c.set("attention.gate_key", "sub", "test");
  c.set("attention.gate_sub_blocks", "8", "test");
  c.set("attention.dense_layers", "last:2", "test");
  const Settings s = from_config(c, 100);
  EXPECT_EQ(s.attention.gate_query, kernels::GateQuery::max);
  EXPECT_EQ(s.attention.gate_key, kernels::GateKey::sub);
  const AttnSettings a = s.attention.at_k0(4, s.balance.dst.k0);
  EXPECT_EQ(a.dense, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_TRUE(a.sparse_at(1));
  EXPECT_FALSE(a.sparse_at(2));
  EXPECT_EQ(a.gating(1).sub_blocks, 8);
  c.set("attention.gate_sub_blocks", "3", "test");  // blocks of 32
  try {
    from_config(c, 100);
    ADD_FAILURE() << "gate_sub_blocks 3 with blocks of 32 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("attention.gate_sub_blocks = 3 must divide attention.block_size = 32"),
              std::string::npos) << e.what();
  }
}

// The MFU count (src/model/README.md) against a hand computation on the tiny shape:
// per layer 2*16 + 4*4*16 + 2*2*4*16 + 16*4*4 + 3*24*16 = 1952; flop_params = 2*1952 + 16 + 23*16
// = 4288. One 16-token document, blocks of 4, dense: 4 query blocks x 2 kv heads = 8 rows keeping
// 2 * (1+2+3+4) = 20 blocks, pairs per query head = 16 * (20 - 8/2) / 2 = 128 (= 16^2 / 2), so
// attention 3 * 4 * H*D * 128 = 24576 per layer. Total 6 * 4288 * 16 + 2 * 24576 = 460800.
TEST(Model, TrainFlopsMatchAHandCount) {
  ModelDims d = tiny_dims(true);
  EXPECT_EQ(d.flop_params(), 4288);
  Model<double> m(d);
  m.init(1);
  PackedBatch b = random_batch({16}, d.vocab, 2);
  auto st = m.forward(b, settings(false, d.n_layers, 0));
  ASSERT_EQ(st.gating[0].rows, 8);
  ASSERT_EQ(st.gating[0].kept_blocks, 20);
  EXPECT_DOUBLE_EQ(train_flops(d, 16, st.gating, 4), 460800.0);
  // Sparse keeps fewer pairs, so fewer FLOPs; the linear part stays.
  PackedBatch lb = random_batch({64}, d.vocab, 3);
  auto sp = m.forward(lb, settings(true, d.n_layers, 0));
  auto de = m.forward(lb, settings(false, d.n_layers, 0));
  EXPECT_LT(train_flops(d, 64, sp.gating, 4), train_flops(d, 64, de.gating, 4));
  EXPECT_GT(train_flops(d, 64, sp.gating, 4), 6.0 * 4288 * 64);
}

TEST(Model, HuggingFaceNamesAndShapes) {
  ModelDims d = tiny_dims(false);
  Model<float> m(d);
  EXPECT_EQ(m.param("model.embed_tokens.weight").shape, (std::vector<int64_t>{23, 16}));
  EXPECT_EQ(m.param("model.layers.1.self_attn.q_proj.weight").shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(m.param("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(m.param("model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(m.param("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(m.param("model.layers.0.mlp.gate_proj.weight").shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(m.param("model.layers.0.post_attention_layernorm.weight").shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(m.param("lm_head.weight").shape, (std::vector<int64_t>{23, 16}));
  EXPECT_EQ(int64_t(m.weights().size()), d.num_params());
  Model<float> tied(tiny_dims(true));
  EXPECT_THROW(tied.param("lm_head.weight"), std::exception);
  EXPECT_EQ(int64_t(tied.weights().size()), tiny_dims(true).num_params());
}

TEST(Model, InitStatistics) {
  ModelDims d = tiny_dims(true);
  d.d_model = 64, d.head_dim = 16, d.ffn_dim = 256, d.vocab = 512, d.init_std = 0.02;
  Model<float> m(d);
  m.init(1);
  auto stdev = [&](const std::string& name) {
    const auto& p = m.param(name);
    double s = 0;
    for (size_t i = 0; i < p.size; ++i) s += double(m.weights()[p.offset + i]) * m.weights()[p.offset + i];
    return std::sqrt(s / double(p.size));
  };
  EXPECT_NEAR(stdev("model.embed_tokens.weight"), 0.02, 0.001);
  EXPECT_NEAR(stdev("model.layers.0.mlp.down_proj.weight"), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_EQ(m.weights()[m.param("model.norm.weight").offset], 1.0f);
}

TEST(Model, TrainingStepsLowerTheLossOnALearnableSequence) {
  // A repeating pattern is learnable: a few dozen AdamW steps must cut the loss by far.
  ModelDims d = tiny_dims(true);
  d.init_std = 0.02;
  Model<float> m(d);
  m.init(3);
  PackedBatch b;
  std::vector<uint32_t> seq;
  for (int i = 0; i < 96; ++i) seq.push_back(uint32_t((i * 7) % 11));
  b.add(seq);
  OptimSettings o{1e-2, 0.1, 0.0, 0.9, 0.95, 1e-8, 1.0, 2, 40};
  AdamW opt(o, m.weights().size());
  AttnSettings a = settings(true, d.n_layers, 2);
  double first = 0, last = 0;
  for (int s = 1; s <= 40; ++s) {
    m.zero_grads();
    auto st = m.forward_backward(b, a, 1.0f / 95);
    if (s == 1) first = st.loss_sum / 95;
    last = st.loss_sum / 95;
    opt.step(m, m.grads(), global_norm(m.grads()), lr_at(o, s), s);
  }
  EXPECT_LT(last, 0.3 * first) << "first " << first << " last " << last;
}

TEST(Update, ScheduleWarmupCosineAndClip) {
  OptimSettings o{1.0, 0.1, 0.0, 0.9, 0.95, 1e-8, 1.0, 4, 14};
  EXPECT_DOUBLE_EQ(lr_at(o, 1), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(o, 4), 1.0);
  EXPECT_NEAR(lr_at(o, 9), 0.55, 1e-12);  // halfway through the cosine: (1 + 0.1) / 2
  EXPECT_NEAR(lr_at(o, 14), 0.1, 1e-12);
  std::vector<float> g = {3, 4};
  EXPECT_DOUBLE_EQ(global_norm(g), 5.0);
}

// train.decay_steps: a 6-step run follows the first 6 steps of the 30-step schedule exactly (the
// GPU benchmarks' configs rely on it: a cosine over 6 steps spiked at step 6, bench/results/2026-12-01-loss-spike.md), and
// a run longer than its decay horizon holds the floor.
TEST(Update, DecayStepsSetTheCosineHorizon) {
  auto optim = [](const std::string& steps, const std::string& decay) {
    sb::Config c;
    c.set("train.lr", "3e-4", "test");
    c.set("train.warmup_steps", "2", "test");
    c.set("train.steps", steps, "test");
    c.set("train.decay_steps", decay, "test");
    return sb::optim_settings(c);
  };
  const auto long_run = optim("30", "0"), short_run = optim("6", "30"), plain_short = optim("6", "0");
  EXPECT_EQ(long_run.total_steps, 30);
  for (int s = 1; s <= 6; ++s) EXPECT_DOUBLE_EQ(lr_at(short_run, s), lr_at(long_run, s)) << "step " << s;
  EXPECT_LT(lr_at(plain_short, 5), 0.3 * lr_at(short_run, 5));  // the 6-step cosine is near its floor by step 5
  const auto held = optim("50", "20");
  EXPECT_NEAR(lr_at(held, 20), 3e-5, 1e-15);
  EXPECT_NEAR(lr_at(held, 50), 3e-5, 1e-15);
}

// generate's KV cache (src/model/decode.hpp): a prefix at once, then one token at a time, gives the
// full forward's logits at every position, for each family (Qwen2 biases; Qwen3 q/k norms, decoupled
// head_dim and YaRN).
TEST(Decode, IncrementalLogitsEqualFullForward) {
  ModelDims qwen3 = tiny_dims(false);
  qwen3.qk_norm = true, qwen3.head_dim = 8, qwen3.rope_scaling.type = "yarn", qwen3.rope_scaling.factor = 4;
  qwen3.rope_scaling.original_max_positions = 8;
  for (const ModelDims& dims : {tiny_dims(true, true), qwen3}) {
    Model<double> m(dims);
    m.init(11);
    for (const auto& p : m.params())  // norms and biases away from 1 and 0
      if (!p.decay)
        for (size_t i = 0; i < p.size; ++i) m.weights()[p.offset + i] += 0.3 * std::sin(double(i + p.offset));
    PackedBatch b = random_batch({19}, dims.vocab, 9);
    const std::vector<double> full = m.forward_logits(b, settings(false, dims.n_layers, 1));  // (19, V)
    Decoder<double> dec(m);
    const int V = dims.vocab, prefix = 7;
    std::vector<double> got = dec.append(std::span(b.tokens).first(prefix), prefix);  // every prefix row
    for (int t = prefix; t < b.n(); ++t) {
      const std::vector<double> row = dec.append(std::span(b.tokens).subspan(size_t(t), 1));
      got.insert(got.end(), row.begin(), row.end());
    }
    ASSERT_EQ(got.size(), full.size());
    double err = 0;
    for (size_t i = 0; i < full.size(); ++i) err = std::max(err, std::abs(got[i] - full[i]));
    EXPECT_LT(err, 1e-11) << "qk_norm " << dims.qk_norm;
    EXPECT_EQ(dec.len(), b.n());
    EXPECT_GT(std::abs(full[0] - full[size_t(V)]), 1e-3);  // logits differ by position: not a constant
  }
}

// Greedy generation equals the argmax of a full forward at every step, through the cache (dense) and
// through the full forward per token (sparse with every block kept gives the same tokens).
TEST(Decode, GreedyIsTheFullForwardArgmaxAtEachStep) {
  const ModelDims dims = tiny_dims(true);
  Model<float> m(dims);
  m.init(5);
  const std::vector<int32_t> prompt = {3, 17, 9, 1, 22};
  Decoder<float> dec(m);
  GenerateOptions o;
  o.max_new = 14;
  const Generated g = generate(prompt, [&](const std::vector<int32_t>& seq, int fresh) {
    return dec.append(std::span(seq).last(size_t(fresh)));
  }, o);
  ASSERT_EQ(g.ids.size(), 14u);
  std::vector<int32_t> seq = prompt;
  for (size_t t = 0; t < g.ids.size(); ++t) {
    PackedBatch b;
    b.add(std::vector<uint32_t>(seq.begin(), seq.end()));
    const std::vector<float> row = m.forward_logits(b, settings(false, dims.n_layers, 1), b.n() - 1);
    const auto best = std::max_element(row.begin(), row.end());
    EXPECT_EQ(g.ids[t], int32_t(best - row.begin())) << "step " << t;
    double sum = 0;
    for (float z : row) sum += std::exp(double(z) - *best);
    EXPECT_NEAR(g.logprobs[t], -std::log(sum), 1e-4);
    seq.push_back(g.ids[t]);
  }
  const AttnSettings all = settings(true, dims.n_layers, 1000);  // sparse, every block kept
  const Generated s = generate(prompt, [&](const std::vector<int32_t>& q, int) {
    PackedBatch b;
    b.add(std::vector<uint32_t>(q.begin(), q.end()));
    return m.forward_logits(b, all, b.n() - 1);
  }, o);
  EXPECT_EQ(s.ids, g.ids);
  o.stop = {g.ids[3]};  // stops at the first stop id, keeping it
  const Generated cut = generate(prompt, [&](const std::vector<int32_t>& q, int) {
    PackedBatch b;
    b.add(std::vector<uint32_t>(q.begin(), q.end()));
    return m.forward_logits(b, all, b.n() - 1);
  }, o);
  EXPECT_TRUE(cut.stopped);
  EXPECT_EQ(cut.ids.back(), g.ids[3]);
  EXPECT_LE(cut.ids.size(), 4u);
}

// Sampling: temperature draws follow softmax(logits / T); top-p keeps the likeliest tokens whose mass
// reaches p; u picks through the cumulative mass.
TEST(Decode, SamplingFollowsTemperatureAndTopP) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.0f, 2.0f};  // order by probability: 1, 3, 0, 2
  EXPECT_EQ(pick_token(logits, 0, 1, 0.9), 1);
  EXPECT_EQ(pick_token(logits, 1, 0.01, 0.99), 1);  // the nucleus holds one token
  std::vector<double> p(4);
  double sum = 0;
  for (int i = 0; i < 4; ++i) sum += p[size_t(i)] = std::exp(logits[size_t(i)] / 2.0);
  std::vector<int> count(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[size_t(pick_token(logits, 2.0, 1, (i + 0.5) / n))];
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(count[size_t(i)] / double(n), p[size_t(i)] / sum, 1e-3) << "token " << i;
  // top_p 0.8 at T = 1: tokens 1 (0.64) and 3 (0.24) reach it; 0 and 2 never come
  std::fill(count.begin(), count.end(), 0);
  for (int i = 0; i < 1000; ++i) ++count[size_t(pick_token(logits, 1, 0.8, (i + 0.5) / 1000))];
  EXPECT_EQ(count[0] + count[2], 0);
  EXPECT_NEAR(count[1] / 1000.0, 0.6439 / (0.6439 + 0.2369), 2e-3);
}
