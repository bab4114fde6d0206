// LoRA on the CPU model ([lora], src/model/README.md "LoRA"), a second source of test_model:
// adapter and train_also gradients against float64 finite differences, a frozen base that never
// changes under AdamW, the merged weights equal to base + (alpha / rank) B A and giving the adapted
// model's loss, PEFT's names and init, and bad [lora] values refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/lora_dropout.hpp"
#include "src/config/config.hpp"
#include "src/engine/memory_plan.hpp"
#include "src/model/gpu_buffers.hpp"
#include "src/engine/update.hpp"
#include "src/model/model.hpp"
#include "src/train/settings.hpp"
#include "tests/train/model_test_util.hpp"

using namespace sb;

namespace {

using sbtest::random_batch;
using sbtest::tiny_dims;

AttnSettings lora_attn(bool sparse, int layers) {
  AttnSettings a;
  a.sparse = sparse, a.block_size = 4, a.local_blocks = 1, a.theta = 1e9;
  a.k.assign(layers, 1);
  return a;
}

LoraSpec spec(int rank, double alpha, std::array<bool, kLoraTargets> targets, bool embed, bool norm, bool head) {
  LoraSpec s;
  s.rank = rank, s.alpha = alpha, s.targets = targets;
  s.embed = embed, s.norm = norm, s.head = head;
  return s;
}

// A LoRA model with every trainable value random (B too: at init B = 0 leaves A without gradient)
// and nonzero base biases.
template <class T>
Model<T> random_lora_model(const ModelDims& d, const LoraSpec& s, uint64_t seed) {
  Model<T> m(d, s);
  m.init(seed);
  std::vector<T> base = m.base();
  for (const auto& p : m.base_layout().params)
    if (p.name.ends_with(".bias"))
      for (size_t i = 0; i < p.size; ++i) base[p.offset + i] = T(0.1 * double(i % 7) - 0.3);
  m.set_base(base);  // copies the train_also parts again
  std::mt19937_64 rng(seed + 1);
  for (auto& w : m.weights()) w += T(0.2 * (double(rng() % 2001) / 1000.0 - 1.0));
  return m;
}

// The training loss: lora.dropout applies in forward_backward only (forward() is eval).
double loss(Model<double>& m, const PackedBatch& b, const AttnSettings& a) {
  return m.lora().dropout > 0 ? m.forward_backward(b, a, 1.0).loss_sum : m.forward(b, a).loss_sum;
}

void check_lora_gradients(const ModelDims& d, const LoraSpec& s, bool sparse) {
  Model<double> m = random_lora_model<double>(d, s, 7);
  m.set_dropout_key(kernels::dropout_micro_batch_key(7, 3, 0, 1));
  const PackedBatch b = random_batch({13, 5, 21}, d.vocab, 3);
  const AttnSettings a = lora_attn(sparse, d.n_layers);
  m.zero_grads();
  m.forward_backward(b, a, 1.0);
  const std::vector<double> g = m.grads();
  std::mt19937_64 rng(11);
  const double h = 1e-5;
  for (const auto& p : m.params()) {
    double worst = 0;
    for (int trial = 0; trial < 4; ++trial) {
      const size_t i = p.offset + rng() % p.size;
      const double w0 = m.weights()[i];
      m.weights()[i] = w0 + h;
      const double lp = loss(m, b, a);
      m.weights()[i] = w0 - h;
      const double lm = loss(m, b, a);
      m.weights()[i] = w0;
      const double fd = (lp - lm) / (2 * h);
      worst = std::max(worst, std::abs(fd - g[i]) / std::max(1e-6, std::abs(fd) + std::abs(g[i])));
    }
    EXPECT_LT(worst, 1e-6) << p.name << (sparse ? " (sparse)" : " (dense)");
  }
}

constexpr std::array<bool, kLoraTargets> kAll{true, true, true, true, true, true, true};

}  // namespace

// Every target, the norms and an untied head trained beside them, q/k/v biases frozen; sparse.
TEST(Lora, GradientsMatchFiniteDifferencesSparse) {
  check_lora_gradients(tiny_dims(false, true), spec(3, 6, kAll, true, true, true), true);
}
// Some targets, a tied embedding trained (as the head too), dense attention.
TEST(Lora, GradientsMatchFiniteDifferencesDenseTied) {
  check_lora_gradients(tiny_dims(true, false), spec(2, 5, {true, false, true, false, false, true, true}, true, false, false),
                       false);
}

// lora.dropout = 0.4 on the adapters' input: the gradients of the dropped draw (the mask drawn
// again in the backward) against finite differences of the same draw's loss; the draw depends on
// the key, and eval (forward) never drops.
TEST(Lora, DropoutGradientsMatchFiniteDifferences) {
  LoraSpec s = spec(3, 6, kAll, false, true, true);
  s.dropout = 0.4;
  const ModelDims d = tiny_dims(false, true);
  check_lora_gradients(d, s, true);
  Model<double> m = random_lora_model<double>(d, s, 7);
  LoraSpec s0 = s;
  s0.dropout = 0;
  Model<double> m0 = random_lora_model<double>(d, s0, 7);  // the same weights, no dropout
  const PackedBatch b = random_batch({13, 5, 21}, d.vocab, 3);
  const AttnSettings a = lora_attn(true, d.n_layers);
  auto train_loss = [&](uint64_t key) {
    m.set_dropout_key(key);
    return m.forward_backward(b, a, 1.0).loss_sum;
  };
  const double k1 = train_loss(1), k1again = train_loss(1), k2 = train_loss(2);
  EXPECT_EQ(k1, k1again);
  EXPECT_NE(k1, k2);
  EXPECT_NE(k1, m0.forward_backward(b, a, 1.0).loss_sum);
  EXPECT_EQ(m.forward(b, a).loss_sum, m0.forward(b, a).loss_sum);
  // about p of the elements dropped
  const uint32_t thr = kernels::dropout_threshold(0.4);
  int kept = 0;
  for (uint64_t i = 0; i < 100000; ++i) kept += kernels::dropout_keep(kernels::dropout_key(5, 1, 2), i, thr);
  EXPECT_NEAR(kept / 100000.0, 0.6, 0.01);
}

// train.recompute = "layer" recomputes the adapters' saved (N, rank) products too: the same
// gradients bit for bit, with the LM head chunked as well.
TEST(Lora, RecomputationEqualsStoredActivations) {
  const ModelDims d = tiny_dims(true, true);
  Model<double> m = random_lora_model<double>(d, spec(3, 4, kAll, true, true, true), 13);
  const PackedBatch b = random_batch({30, 7, 19}, d.vocab, 6);
  const AttnSettings a = lora_attn(true, d.n_layers);
  auto run = [&](ModelExec e) {
    m.set_exec(e);
    m.zero_grads();
    const double loss = m.forward_backward(b, a, 0.05).loss_sum;
    return std::pair{loss, m.grads()};
  };
  const auto [l0, g0] = run({0, false});
  const auto [l1, g1] = run({0, true});
  EXPECT_EQ(l1, l0);
  EXPECT_TRUE(g1 == g0) << "recomputed LoRA gradients differ";
}

TEST(Lora, LayoutNamesShapesAndPeftInit) {
  const ModelDims d = tiny_dims(false, false);
  Model<float> m(d, spec(4, 8, {true, false, false, false, false, false, true}, false, true, false));
  m.init(5);
  // trainable: per layer input_layernorm, q's A and B, post_attention_layernorm, down's A and B; the final norm
  ASSERT_EQ(m.params().size(), size_t(2 * 6 + 1));
  const ParamInfo& qa = m.param("model.layers.0.self_attn.q_proj.lora_A.weight");
  const ParamInfo& qb = m.param("model.layers.0.self_attn.q_proj.lora_B.weight");
  const ParamInfo& da = m.param("model.layers.1.mlp.down_proj.lora_A.weight");
  EXPECT_EQ(qa.shape, (std::vector<int64_t>{4, d.d_model}));
  EXPECT_EQ(qb.shape, (std::vector<int64_t>{int64_t(d.n_heads) * d.head_dim, 4}));
  EXPECT_EQ(da.shape, (std::vector<int64_t>{4, d.ffn_dim}));
  EXPECT_EQ(m.param("model.norm.weight").size, size_t(d.d_model));
  // PEFT: A ~ uniform(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_, a = sqrt(5)), B = 0
  const double bound = 1 / std::sqrt(double(d.ffn_dim));
  double lo = 1, hi = -1, sum2 = 0;
  for (size_t i = 0; i < da.size; ++i) {
    const double v = m.weights()[da.offset + i];
    lo = std::min(lo, v), hi = std::max(hi, v), sum2 += v * v;
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_NEAR(std::sqrt(sum2 / double(da.size)), bound / std::sqrt(3.0), 0.25 * bound);  // the uniform's std
  for (size_t i = 0; i < qb.size; ++i) ASSERT_EQ(m.weights()[qb.offset + i], 0.f);
  // B = 0: the adapted model starts as the base, whose init is LoRA's own stream's neighbour
  Model<float> full(d);
  full.init(5);
  EXPECT_TRUE(full.weights() == m.base()) << "the base must be the full model's init of the same seed";
}

// AdamW on the trainable tensors: the base stays bit for bit; the merged weights are base +
// (alpha / rank) B A (and the trained norms) and the plain model on them gives the adapted loss.
TEST(Lora, FrozenBaseAndMergedWeights) {
  const ModelDims d = tiny_dims(false, true);
  const LoraSpec s = spec(2, 7, {true, true, false, true, true, false, true}, false, true, false);
  Model<double> m(d, s);
  m.init(9);
  const std::vector<double> base0 = m.base();
  const PackedBatch b = random_batch({17, 9}, d.vocab, 4);
  const AttnSettings a = lora_attn(true, d.n_layers);
  // AdamW runs in float: drive a float twin and copy its trainable weights over
  Model<float> mf(d, s);
  mf.init(9);
  OptimSettings o{2e-2, 0.1, 0.1, 0.9, 0.95, 1e-8, 1.0, 1, 6};
  AdamW opt(o, mf.weights().size());
  for (int step = 1; step <= 6; ++step) {
    mf.zero_grads();
    mf.forward_backward(b, a, 1.0f / 24);
    opt.step(mf, mf.grads(), global_norm(mf.grads()), lr_at(o, step), step);
  }
  const std::vector<float> fbase0(base0.begin(), base0.end());
  EXPECT_TRUE(mf.base() == fbase0) << "AdamW changed the frozen base";
  for (size_t i = 0; i < m.weights().size(); ++i) m.weights()[i] = mf.weights()[i];
  EXPECT_TRUE(m.base() == base0);
  const ParamInfo& B = m.param("model.layers.1.self_attn.o_proj.lora_B.weight");
  double bsum = 0;
  for (size_t i = 0; i < B.size; ++i) bsum += std::abs(m.weights()[B.offset + i]);
  ASSERT_GT(bsum, 0) << "training left B at zero: the check below would be empty";

  const std::vector<double> merged = m.merged();
  // one entry by hand: o_proj of layer 1, row 3, column 5
  const ParamInfo& W = m.base_layout().params[target_param(m.base_layout().layers[1], 3)];
  const ParamInfo& A = m.param("model.layers.1.self_attn.o_proj.lora_A.weight");
  const int in = int(W.shape[1]), r = s.rank, row = 3, col = 5;
  double want = base0[W.offset + size_t(row) * in + col];
  for (int j = 0; j < r; ++j)
    want += s.scale() * m.weights()[B.offset + size_t(row) * r + j] * m.weights()[A.offset + size_t(j) * in + col];
  EXPECT_NEAR(merged[W.offset + size_t(row) * in + col], want, 1e-12);
  // an untargeted projection (v) is the base; a trained norm is the trained copy
  const ParamInfo& V = m.base_layout().params[target_param(m.base_layout().layers[0], 2)];
  for (size_t i = 0; i < V.size; ++i) ASSERT_EQ(merged[V.offset + i], base0[V.offset + i]);
  const ParamInfo& n = m.param("model.norm.weight");
  const ParamInfo& nb = m.base_layout().params[m.base_layout().norm];
  for (size_t i = 0; i < n.size; ++i) ASSERT_EQ(merged[nb.offset + i], m.weights()[n.offset + i]);

  Model<double> plain(d);
  plain.weights() = merged;
  const double want_loss = m.forward(b, a).loss_sum, got = plain.forward(b, a).loss_sum;
  EXPECT_NEAR(got, want_loss, 1e-10 * want_loss);
}

TEST(Lora, BadKeysRefusedByName) {
  auto err = [](std::vector<std::string> sets) {
    try {
      lora_spec(Config::load("", sets));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(err({"lora.rank=8", "lora.targets=q, v,down"}), "no error");
  EXPECT_EQ(err({"lora.rank=8", "lora.train_also=embed,norm,head"}), "no error");
  EXPECT_NE(err({"lora.targets=q,qq"}).find("lora.targets"), std::string::npos);
  EXPECT_NE(err({"lora.targets=q,qq"}).find("\"qq\""), std::string::npos);
  EXPECT_NE(err({"lora.targets=q,,v"}).find("empty item"), std::string::npos);
  EXPECT_NE(err({"lora.targets=q,q"}).find("twice"), std::string::npos);
  EXPECT_NE(err({"lora.rank=4", "lora.targets="}).find("lora.targets is empty"), std::string::npos);
  EXPECT_NE(err({"lora.train_also=bias"}).find("lora.train_also"), std::string::npos);
  EXPECT_EQ(err({"lora.rank=8", "lora.dropout=0.1"}), "no error");
  EXPECT_NE(err({"lora.dropout=1"}).find("lora.dropout"), std::string::npos);
  EXPECT_NE(err({"lora.rank=-1"}).find("lora.rank"), std::string::npos);
  EXPECT_NE(err({"lora.alpha=0"}).find("lora.alpha"), std::string::npos);
  const LoraSpec s = lora_spec(Config::load("", std::vector<std::string>{"lora.rank=8", "lora.alpha=32",
                                                                       "lora.targets=v,q", "lora.train_also=norm"}));
  EXPECT_EQ(s.rank, 8);
  EXPECT_DOUBLE_EQ(s.scale(), 4.0);
  EXPECT_TRUE(s.targets[0] && !s.targets[1] && s.targets[2] && !s.targets[3]);
  EXPECT_TRUE(s.norm && !s.embed && !s.head);
}

// `sparsebalance memory`: the CPU plan counts what the model holds (the base, the trainable
// tensors) and the optimizer's slice; LoRA's activations add the adapters' (N, rank) buffers.
TEST(Lora, MemoryPlanCountsTheModelsTensors) {
  Settings s;
  s.model = tiny_dims(false, true);
  s.train.device = "cpu", s.train.micro_batch_tokens = 64;
  s.lora = spec(4, 8, kAll, false, true, false);
  const std::vector<MemoryPlanRow> rows = memory_plan(s.model, s.lora, s.engine(), s.attention, 4, s.train.micro_batch_tokens, 3);
  ASSERT_EQ(rows.size(), 4u);
  Model<float> m(s.model, s.lora);
  const double P = double(m.base().size()), T = double(m.weights().size());
  EXPECT_EQ(rows[0].base, 0);
  EXPECT_EQ(rows[0].weights, 4 * P);
  EXPECT_EQ(rows[0].optimizer, 8 * P);
  EXPECT_EQ(rows[2].base, 4 * P);
  EXPECT_EQ(rows[2].weights, 4 * T);
  EXPECT_EQ(rows[2].grads, 4 * T);
  const double k = double(slice_of(size_t(T), 0, 3).size());
  EXPECT_EQ(rows[3].optimizer, 12 * k);  // moments and the reduced gradient of rank 0's slice
  const double u = 7.0 * 4 * 64 * s.model.n_layers * 4;  // seven targets' (N, rank) floats per layer
  EXPECT_EQ(rows[2].activations - rows[0].activations, u);
  // CUDA (model_cuda.cpp): the frozen base once, bf16, its q/k/v biases fp32 (read in fp32); the
  // trained norms' fp32 copies beside the bf16 ones under ZeRO, a full fp32 master without
  s.train.device = "cuda";
  const std::vector<MemoryPlanRow> g = memory_plan(s.model, s.lora, s.engine(), s.attention, 4, s.train.micro_batch_tokens, 3);
  double norms = 0, biases = 0;
  for (const auto& p : m.params()) norms += p.name.find("lora_") == std::string::npos ? double(p.size) : 0;
  for (const auto& p : m.base_layout().params) biases += p.name.ends_with(".bias") ? double(p.size) : 0;
  ASSERT_GT(norms, 0);
  ASSERT_GT(biases, 0);
  EXPECT_EQ(g[2].base, 2 * (P - norms - biases) + 4 * biases);
  EXPECT_EQ(g[2].weights, 6 * T);
  EXPECT_EQ(g[2].grads, 4 * T);
  EXPECT_EQ(g[3].weights, 2 * T + 4 * norms);
  EXPECT_EQ(g[0].base, 0);
}

// The GPU rows' activations: the buffers ModelCuda sizes through gpu_buffers() (model_cuda.cpp),
// against a hand count of model_cuda.hpp's shapes for the tiny shape (C 16, H 4, Hkv 2, D 4, F 24,
// V 23, 2 layers, q/k/v biases) at N = 64; recomputation keeps one layer's buffers beside every
// layer's input; LoRA adds its (N, rank) u per adapter and its backward scratch; all of it linear in N.
TEST(Lora, MemoryPlanCountsTheGpuBuffers) {
  Settings s;
  s.model = tiny_dims(false, true);
  s.train.device = "cuda", s.train.micro_batch_tokens = 64;
  s.attention = lora_attn(true, 2);
  auto plan = [&](const LoraSpec& l) { return memory_plan(s.model, l, s.engine(), s.attention, 1, s.train.micro_batch_tokens, 1); };
  const double N = 64, C = 16, HD = 16, KD = 8, H = 4, F = 24, V = 23, L = 2, P3 = HD + 2 * KD;
  const double f32 = 4, b16 = 2;
  // Layer: x_in, rstd1, xn, q, k, v, att, lse, x_mid, rstd2, xn2, h, gu
  const double input = f32 * N * C;
  const double layer = input + f32 * N + b16 * (N * C + N * HD + 2 * N * KD + N * HD) + f32 * N * H + f32 * N * C +
                       f32 * N + b16 * (N * C + N * F + 2 * N * F);
  // tokens_, targets_, pos_, argmax_; loss_, rstdf_; qkv_, xs_top_, xf_, head16_ (all 64 rows: the
  // auto chunk holds 1 GiB of logits); dxf_, dx_, dxn_, dx16_, dh_, dgu_, dqkv_, datt_, dq_, dk_, dv_;
  // the attention backward's workspace (dq fp32 and two floats a row and head, 6144 bytes, already
  // a multiple of 256, then dK, dV fp32); the packed q|k|v weights (biases sit between them)
  const double run = 4 * 4 * N + 2 * f32 * N + b16 * N * P3 + f32 * N * C + b16 * N * C + b16 * N * V +
                     3 * f32 * N * C + b16 * N * C + b16 * (N * F + 2 * N * F + N * P3 + 2 * N * HD + 2 * N * KD) +
                     (f32 * N * H * (4 + 2) + 2 * f32 * N * KD) + b16 * L * P3 * C;
  EXPECT_EQ(layer, 29184);
  EXPECT_EQ(run, 60800);
  const GpuBuffers z = gpu_buffers(s.model, s.engine().exec, LoraSpec{}, 64, false);
  EXPECT_EQ(z.bytes(), L * layer + run);
  const double sel = gpu_selection_bytes(s.model, s.attention, 1, 64);
  EXPECT_GT(sel, 0);
  const std::vector<MemoryPlanRow> full = plan(LoraSpec{});
  EXPECT_EQ(full[0].activations, L * layer + run + sel);
  EXPECT_EQ(full[0].runtime, kCudaRuntimeBytes);
  EXPECT_EQ(full[0].total(), full[0].base + full[0].weights + full[0].grads + full[0].optimizer + full[0].activations +
                                 kCudaRuntimeBytes);
  // LoRA r 4 on all seven targets: u (N, 4) bf16 per adapter and layer, du once; q, k, v adjacent in
  // the frozen base (its biases are fp32 apart), so no packed copy
  const LoraSpec lo = spec(4, 8, kAll, false, false, false);
  const std::vector<MemoryPlanRow> lr = plan(lo);
  EXPECT_EQ(lr[2].activations - full[0].activations, L * 7 * b16 * N * 4 + b16 * N * 4 - b16 * L * P3 * C);
  // lora.dropout: the dropped input and du A before the mask, (N, F) at their widest (down's input)
  LoraSpec ld = lo;
  ld.dropout = 0.1;
  EXPECT_EQ(plan(ld)[2].activations - lr[2].activations, (b16 + f32) * N * F);
  // train.recompute = layer: every layer's input, one layer's rest
  s.train.exec.recompute = true;
  const std::vector<MemoryPlanRow> rc = plan(LoraSpec{});
  EXPECT_EQ(full[0].activations - rc[0].activations, (L - 1) * (layer - input));
  EXPECT_EQ(plan(lo)[2].activations - rc[0].activations, 7 * b16 * N * 4 + b16 * N * 4 - b16 * L * P3 * C);
  // linear in N (a head chunk below N, so its logits stay one chunk)
  s.model.n_layers = 3, s.train.exec.lm_head_chunk = 32;
  const ModelExec e = s.engine().exec;
  const double a1 = gpu_buffers(s.model, e, lo, 256, true).bytes(), a2 = gpu_buffers(s.model, e, lo, 512, true).bytes(),
               a3 = gpu_buffers(s.model, e, lo, 768, true).bytes();
  EXPECT_GT(a2, a1);
  EXPECT_EQ(a3 - a2, a2 - a1);
  // dense keeps every causal block: its lists grow with their count, a sparse run's with the blocks
  AttnSettings dense = s.attention;
  dense.sparse = false;
  EXPECT_GT(gpu_selection_bytes(s.model, dense, 1, 2048), 3 * gpu_selection_bytes(s.model, dense, 1, 1024));
  EXPECT_LT(gpu_selection_bytes(s.model, s.attention, 1, 2048), 2.2 * gpu_selection_bytes(s.model, s.attention, 1, 1024));
}

// Where the GPU model keeps each tensor (gpu_frozen_copies, gpu_qkv_adjacent: ModelCuda's constructor
// checks its buffers against them): Qwen2's biases between q, k and v break the adjacency of the
// full model's weights, not of LoRA's frozen base (biases in fp32 apart), nor of a model without biases.
TEST(Lora, GpuCopiesAndPackedProjections) {
  for (bool bias : {false, true}) {
    const ModelDims d = tiny_dims(false, bias);
    const ParamLayout base(d);
    const LoraLayout full = lora_layout(base, d, LoraSpec{});
    EXPECT_EQ(gpu_qkv_adjacent(base, full.train, full.of_base, gpu_frozen_copies(base, full.of_base)), !bias);
    const LoraLayout ll = lora_layout(base, d, spec(2, 4, kAll, false, true, false));
    const GpuFrozenCopies f = gpu_frozen_copies(base, ll.of_base);
    EXPECT_TRUE(gpu_qkv_adjacent(base, ll.train, ll.of_base, f));
    double biases = 0, trained = 0;
    for (size_t i = 0; i < base.params.size(); ++i) {
      biases += base.params[i].name.ends_with(".bias") ? double(base.params[i].size) : 0;
      trained += ll.of_base[i] != kNoParam ? double(base.params[i].size) : 0;
    }
    EXPECT_EQ(double(f.n32), biases);  // the frozen tensors read in fp32: the biases (the norms train)
    EXPECT_EQ(double(f.n16 + f.n32) + trained, double(base.size));
  }
}
