// LoRA on the GPU (issue 52; part of test_train_cuda, needs a GPU, skipped without one):
// - one micro-batch: ModelCuda with adapters on its bf16 frozen base against Model<double> with the
//   same (bf16-rounded) base, adapters and train_also parts: loss and every trainable tensor's
//   gradient (adapters A and B, embedding, norms, head), dense and sparse, tied and not, q/k/v
//   biases, Qwen3's frozen q/k norms, recomputation, a subset of targets, lora.dropout (the same draw);
// - the engine: a few steps keep the device's frozen base bit-identical (its hash) while the
//   adapters move, with train.zero = 0 and 1;
// - `train` with LoRA on the GPU against the CPU engine (same seed: the same base and adapters at
//   step 0): the losses at every step, at 1 and 2 ranks, ZeRO-1 and recomputation; a CPU LoRA
//   checkpoint resumed on the GPU and a GPU one on the CPU continue as the uninterrupted runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "io/checkpoint.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "src/engine/engine.hpp"
#include "src/model/model_cuda.hpp"
#include "src/train/trainer.hpp"
#include "tests/cuda/gpu_test_util.hpp"
#include "tests/train/train_test_util.hpp"

using namespace sbtest;

namespace {

float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

struct LoraCase {
  bool tied = false, sparse = true, qkv_bias = false, qwen3 = false;
  sb::ModelExec exec = {};
  const char* targets = "q,k,v,o,gate,up,down";
  bool embed = false, norm = false, head = false;  // train_also
  double dropout = 0;  // lora.dropout: the same draw on both (set_dropout_key)
};

sb::LoraSpec lora_spec(const LoraCase& c) {
  sb::LoraSpec s;
  s.rank = 8, s.alpha = 16;
  const std::string list = std::string(",") + c.targets + ",";
  for (int t = 0; t < sb::kLoraTargets; ++t)
    s.targets[size_t(t)] = list.find(std::string(",") + sb::kLoraTargetNames[size_t(t)] + ",") != std::string::npos;
  s.embed = c.embed, s.norm = c.norm, s.head = c.head, s.dropout = c.dropout;
  return s;
}

void check_lora_micro_batch(const LoraCase& c) {
  sb::ModelDims d;
  d.n_layers = 2, d.d_model = 256, d.n_heads = 4, d.n_kv_heads = 2, d.head_dim = 64, d.ffn_dim = 384;
  d.vocab = 300, d.tied = c.tied, d.qkv_bias = c.qkv_bias;
  if (c.qwen3) d.head_dim = 128, d.qk_norm = true;
  const sb::LoraSpec spec = lora_spec(c);
  sb::Model<float> host(d, spec);
  host.init(11);
  // the base: random biases and q/k norms (1 +- 0.5), every value bf16 (the GPU's copy is bf16)
  std::vector<float> base = host.base();
  std::mt19937_64 rng(3);
  auto unit = [&] { return float(rng() % 2001) / 1000.0f - 1.0f; };  // uniform in [-1, 1]
  for (const auto& p : host.base_layout().params) {
    const bool qk = p.name.ends_with("q_norm.weight") || p.name.ends_with("k_norm.weight");
    if (p.name.ends_with(".bias") || qk)
      for (size_t i = 0; i < p.size; ++i) base[p.offset + i] = (qk ? 1.0f : 0.0f) + 0.5f * unit();
  }
  for (float& w : base) w = bf16_round(w);
  host.set_base(base);
  // every trainable value moved off its init (B = 0 would leave A without gradient), bf16 too
  for (float& w : host.weights()) w = bf16_round(w + 0.05f * unit());
  sb::Model<double> ref(d, spec);
  ref.set_base(std::vector<double>(base.begin(), base.end()), false);
  ref.weights().assign(host.weights().begin(), host.weights().end());

  const sb::PackedBatch b = [&] {
    sb::PackedBatch pb;
    std::mt19937_64 brng(5);
    for (int len : {300, 130, 64, 9}) {
      std::vector<uint32_t> seq(static_cast<size_t>(len));
      for (auto& t : seq) t = uint32_t(brng() % uint64_t(d.vocab));
      pb.add(seq);
    }
    return pb;
  }();
  sb::AttnSettings a;
  a.sparse = c.sparse, a.block_size = 64, a.local_blocks = 1, a.theta = 1e9, a.k = {64, 64};
  const double scale = 1.0 / 500;

  sb::ModelCuda gpu(d, host.base_layout(), spec);
  ASSERT_EQ(gpu.size(), host.weights().size());  // gradients and master of the trainable tensors only
  gpu.set_exec(c.exec);
  gpu.upload_base(host.base());
  gpu.upload_weights(host.weights());
  const uint64_t base0 = gpu.base_hash();
  gpu.set_dropout_key(42), ref.set_dropout_key(42);
  gpu.zero_grads();
  const sb::MicroBatchStats sg = gpu.forward_backward(b, a, float(scale));
  // what the model's buffers hold is what the memory plan counts (src/model/gpu_buffers.hpp): the
  // adapters' u, lora.dropout's copies, no packed q|k|v copy (the frozen base keeps them adjacent)
  EXPECT_EQ(gpu.buffer_bytes(),
            sb::gpu_buffers(d, c.exec, spec, b.n(), sbtest::qkv_adjacent_of(host.base_layout(), d, spec)).bytes());
  std::vector<float> g(gpu.size());
  SB_CUDA_CHECK(cudaMemcpy(g.data(), gpu.grads(), g.size() * sizeof(float), cudaMemcpyDeviceToHost));
  ref.zero_grads();
  const sb::MicroBatchStats sr = ref.forward_backward(b, a, scale);
  EXPECT_EQ(gpu.base_hash(), base0);

  EXPECT_EQ(sg.targets, sr.targets);
  const double loss_err = std::abs(sg.loss_sum - sr.loss_sum) / sr.loss_sum;
  std::printf("lora tied=%d sparse=%d qkv_bias=%d qwen3=%d targets=%s recompute=%d dropout=%.2f: loss gpu %.6f ref %.6f rel %.2e\n",
              c.tied, c.sparse, c.qkv_bias, c.qwen3, c.targets, int(c.exec.recompute), c.dropout, sg.loss_sum, sr.loss_sum,
              loss_err);
  EXPECT_LT(loss_err, 5e-3);
  double worst = 0;
  for (const auto& p : host.params()) {
    double num = 0, den = 0;
    for (size_t i = 0; i < p.size; ++i) {
      ASSERT_TRUE(std::isfinite(g[p.offset + i])) << p.name;
      const double r = ref.grads()[p.offset + i], e = double(g[p.offset + i]) - r;
      num += e * e, den += r * r;
    }
    ASSERT_GT(den, 0) << p.name << ": no gradient in the reference";
    const double e = std::sqrt(num / den);
    worst = std::max(worst, e);
    EXPECT_LT(e, c.qkv_bias || c.qwen3 ? 5e-2 : 3e-2) << p.name;  // as the full model's cases (test_train_cuda.cpp)
  }
  std::printf("  worst gradient rel error %.2e over %zu trainable tensors\n", worst, host.params().size());
}

// Steps of the engine alone: the device's frozen base never changes while the adapters train.
void check_engine_keeps_base(bool zero) {
  sb::Comm comm;
  const std::string dir = scratch(comm, "lora_cuda_engine");
  const sb::Config cfg = tiny_config(
      dir, " --set model.d_model=128 --set model.n_heads=2 --set model.n_kv_heads=1 --set model.ffn_dim=256"
           " --set model.qkv_bias=true --set attention.block_size=128 --set train.device=cuda --set lora.rank=4"
           " --set lora.train_also=norm --set train.zero=" + std::string(zero ? "1" : "0"));
  const sb::Settings s = sb::from_config(cfg, 300);
  sb::Model<float> model(s.model, s.lora);
  model.init(5);
  const size_t n = model.weights().size();
  sb::AdamW opt(s.optim, n, zero ? sb::slice_of(n, comm.rank(), comm.size()) : sb::Slice{0, n});
  std::unique_ptr<sb::Engine> engine = sb::make_engine(s.engine(), comm, model, opt);
  engine->from_host();
  EXPECT_NE(engine->memory_line().find("frozen base"), std::string::npos) << engine->memory_line();
  const uint64_t base0 = engine->base_hash(), w0 = engine->weights_hash();
  EXPECT_NE(base0, 0u);
  std::mt19937_64 rng(17 + uint64_t(comm.rank()));
  sb::PackedBatch b;
  for (int len : {200, 77}) {
    std::vector<uint32_t> seq(static_cast<size_t>(len));
    for (auto& t : seq) t = uint32_t(rng() % 300);
    b.add(seq);
  }
  sb::AttnSettings a;
  a.sparse = false, a.block_size = 128, a.k = {64, 64};
  for (int64_t step = 1; step <= 3; ++step) {
    engine->zero_grads();
    engine->forward_backward(b, a, 1e-3f, true);
    engine->reduce_gradients();
    engine->update(engine->gradient_norm(), 1e-3, step);
  }
  EXPECT_EQ(engine->base_hash(), base0) << "the frozen base changed on the device";
  EXPECT_NE(engine->weights_hash(), w0) << "the adapters did not train";
  engine->to_host();
  double bsum = 0;  // every lora_B started at 0 and has moved
  for (const auto& p : model.params())
    if (p.name.ends_with("lora_B.weight"))
      for (size_t i = 0; i < p.size; ++i) bsum += std::abs(model.weights()[p.offset + i]);
  EXPECT_GT(bsum, 0);
}

const std::string kFlags =
    " --set model.d_model=128 --set model.n_heads=2 --set model.n_kv_heads=1 --set model.ffn_dim=256"
    " --set attention.block_size=128 --set train.micro_batch_tokens=1024 --set train.global_batch_tokens=4096"
    " --set train.lr=5e-3 --set balance.self_profile=false --set lora.rank=8 --set lora.alpha=16 ";

void check_lora_training(const std::string& tag, const std::string& extra, double tol) {
  sb::Comm comm;
  const std::string dir = scratch(comm, "lora_cuda_" + tag);
  std::vector<double> loss[2];
  cpu_and_gpu_losses(comm, dir, kFlags + "--set train.steps=12 " + extra, "", loss);
  double worst = 0;
  expect_losses_close(loss, 12, tol, "lora " + tag + " ", &worst);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_LT(loss[1].back(), loss[1].front());
  if (comm.root())
    std::printf("lora %s: 12 steps, loss %.4f -> %.4f (gpu) vs %.4f -> %.4f (cpu), worst step rel diff %.2e\n",
                tag.c_str(), loss[1].front(), loss[1].back(), loss[0].front(), loss[0].back(), worst);
}

// One device's 6 steps with a checkpoint at step 3, then that checkpoint resumed on the other.
void check_cross_resume() {
  sb::Comm comm;
  const std::string dir = scratch(comm, "lora_cuda_resume");
  const std::string flags = kFlags + "--set train.steps=6 --set checkpoint.every=3 --set attention.mode=dense"
                                     " --set balance.tuning=fixed --set lora.train_also=norm,embed";
  auto run = [&](const std::string& dev, const std::string& tag, const std::string& resume) {
    sb::Config cfg = tiny_config(dir, flags + " --set train.device=" + dev + " --set checkpoint.dir=" + dir + "/ckpt_" +
                                          tag + " --set log.path=" + dir + "/metrics_" + tag + ".h5");
    sb::Trainer t(cfg, comm, resume, 0);
    return t.run();
  };
  const sb::TrainResult cpu = run("cpu", "cpu", ""), gpu = run("cuda", "gpu", "");
  ASSERT_EQ(cpu.losses.size(), 6u);
  ASSERT_EQ(gpu.losses.size(), 6u);
  const sb::TrainResult gpu_from_cpu = run("cuda", "g_from_c", sb::checkpoint_path(dir + "/ckpt_cpu", 3));
  const sb::TrainResult cpu_from_gpu = run("cpu", "c_from_g", sb::checkpoint_path(dir + "/ckpt_gpu", 3));
  const sb::TrainResult gpu_from_gpu = run("cuda", "g_from_g", sb::checkpoint_path(dir + "/ckpt_gpu", 3));
  for (const auto* r : {&gpu_from_cpu, &cpu_from_gpu, &gpu_from_gpu}) {
    EXPECT_EQ(r->first_step, 4);
    ASSERT_EQ(r->losses.size(), 3u);
  }
  for (size_t s = 0; s < 3; ++s) {  // bf16 against fp32 across devices; the same device to rounding
    EXPECT_NEAR(gpu_from_cpu.losses[s], cpu.losses[s + 3], 2e-2 * cpu.losses[s + 3]) << "step " << s + 4;
    EXPECT_NEAR(cpu_from_gpu.losses[s], gpu.losses[s + 3], 2e-2 * gpu.losses[s + 3]) << "step " << s + 4;
    EXPECT_NEAR(gpu_from_gpu.losses[s], gpu.losses[s + 3], 1e-3 * gpu.losses[s + 3]) << "step " << s + 4;
  }
  if (comm.root())
    std::printf("lora resume: step 6 loss cpu %.5f, gpu %.5f, gpu from cpu@3 %.5f, cpu from gpu@3 %.5f, gpu from "
                "gpu@3 %.5f\n", cpu.losses[5], gpu.losses[5], gpu_from_cpu.losses[2], cpu_from_gpu.losses[2],
                gpu_from_gpu.losses[2]);
}

}  // namespace

TEST(ModelCudaLora, AdaptersAndTrainAlsoMatchDoubleReference) {
  if (!have_gpu()) GTEST_SKIP();
  LoraCase c;  // untied, sparse, q/k/v biases (frozen, fp32), every target, norms and head trained
  c.qkv_bias = true, c.norm = true, c.head = true;
  check_lora_micro_batch(c);
  LoraCase t;  // tied, dense, three targets, the embedding (= head) trained, recomputed, chunked head
  t.tied = true, t.sparse = false, t.targets = "q,v,down", t.embed = true, t.exec = sb::ModelExec{100, true};
  check_lora_micro_batch(t);
  LoraCase q;  // Qwen3's frozen q/k norms (no dw), sparse and recomputed, nothing but adapters trained
  q.qwen3 = true, q.exec = sb::ModelExec{0, true};
  check_lora_micro_batch(q);
  LoraCase p;  // lora.dropout: the GPU drops the elements the CPU drops (kernels/lora_dropout.hpp), recomputed too
  p.dropout = 0.3, p.norm = true;
  check_lora_micro_batch(p);
  p.exec = sb::ModelExec{0, true};
  check_lora_micro_batch(p);
}

TEST(EngineCudaLora, StepsKeepTheFrozenBase) {
  if (!have_gpu()) GTEST_SKIP();
  check_engine_keeps_base(false);
  check_engine_keeps_base(true);
}

TEST(TrainCudaLora, LossesMatchCpu) {
  if (!have_gpu()) GTEST_SKIP();
  check_lora_training("dense", "--set attention.mode=dense --set balance.tuning=fixed --set lora.train_also=norm,head"
                      " --set train.recompute=layer", 2e-2);
  check_lora_training("sparse_zero", "--set attention.mode=sparse --set balance.tuning=dst --set attention.k=2"
                      " --set train.zero=1 --set lora.targets=q,v,o,down --set lora.dropout=0.1", 3e-2);
}

TEST(TrainCudaLora, CheckpointsResumeAcrossDevices) {
  if (!have_gpu()) GTEST_SKIP();
  check_cross_resume();
}
