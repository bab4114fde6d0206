// sparsebalance memory: the memory a run needs per rank, planned from its config without running
// it (src/engine/memory_plan.hpp; src/model/README.md "Planning memory").
#include <cstdio>

#include "base/error.hpp"
#include "io/shard.hpp"
#include "src/cli/args.hpp"
#include "src/balance/dst.hpp"
#include "src/engine/memory_plan.hpp"
#include "src/train/batch.hpp"

namespace sb {

static int run_memory(const Args& args) {
  if (args.positional.size() > 1) throw Error("memory: expected at most one config file, got " + std::to_string(args.positional.size()));
  Config cfg = Config::load(args.positional.empty() ? "" : args.positional[0], args.sets);
  int ranks = 1;
  if (args.has("ranks")) {
    const std::string t = args.get("ranks");
    size_t pos = 0;
    try {
      ranks = std::stoi(t, &pos);
    } catch (...) {
      pos = 0;
    }
    if (t.empty() || pos != t.size() || ranks < 1) throw Error("memory: --ranks '" + t + "': expected a whole number >= 1");
  }
  int64_t vocab = 0;  // model.vocab_size = 0 takes the data's: read from data.path when it is there
  if (cfg.i("model.vocab_size") == 0) {
    try {
      vocab = open_data(data_settings(cfg)).vocab_size();  // data.path, or data.sources' mixture
    } catch (const std::exception& e) {
      throw Error("memory: model.vocab_size = 0 takes the vocabulary of data.path, which could not be read (" +
                  std::string(e.what()) + "); set model.vocab_size");
    }
  }
  const Settings s = from_config(cfg, vocab);
  const ModelDims& d = s.model;
  std::printf("memory plan per rank: %d rank(s), train.device = %s, %lld parameters (%d layers, d_model %d, vocab %d), "
              "micro-batch %lld tokens, train.recompute = %s, attention.mode = %s\n", ranks, s.train.device.c_str(),
              static_cast<long long>(ParamLayout(d).size), d.n_layers, d.d_model, d.vocab,
              static_cast<long long>(s.train.micro_batch_tokens), s.train.exec.recompute ? "layer" : "none",
              s.attention.sparse ? "sparse" : "dense");
  const bool cuda = s.train.device == "cuda";
  std::printf("%-26s %12s %12s %12s %12s %12s %12s %12s\n", "run", "base MiB", "weights MiB", "grads MiB", "optim MiB",
              "activ. MiB", "runtime MiB", "total MiB");
  const double mib = 1.0 / (1024.0 * 1024.0);
  // the largest budget a layer may get: DST moves it within budget_steps, a fixed run keeps attention.k
  const int k_max = s.balance.dst.tuning == Tuning::Dst ? budget_steps(s.balance.dst).back() : s.balance.dst.k0;
  for (const MemoryPlanRow& r : memory_plan(d, s.lora, s.engine(), s.attention, k_max, s.train.micro_batch_tokens, ranks)) {
    char act[32], rt[32];
    if (r.activations >= 0) std::snprintf(act, sizeof act, "%12.1f", r.activations * mib);
    else std::snprintf(act, sizeof act, "%12s", "-");
    if (cuda) std::snprintf(rt, sizeof rt, "%12.1f", r.runtime * mib);
    else std::snprintf(rt, sizeof rt, "%12s", "-");
    std::printf("%-26s %12.1f %12.1f %12.1f %12.1f %s %s %12.1f%s\n", r.run.c_str(), r.base * mib, r.weights * mib,
                r.grads * mib, r.optimizer * mib, act, rt, r.total() * mib, r.activations < 0 ? " + activations" : "");
  }
  if (!s.lora.on()) std::printf("(LoRA rows: lora.rank = 16, alpha 32 on every target, as the config sets no [lora])\n");
  if (cuda)
    std::printf("(GPU: activations are the model's buffers for one %lld-token micro-batch and the block lists of one "
                "document that long; runtime is an estimate of the CUDA context, cuBLAS and NCCL, which the measured "
                "peak (cudaMemGetInfo: the whole device) includes; allocator rounding is not counted)\n",
                static_cast<long long>(s.train.micro_batch_tokens));
  return 0;
}

Command cmd_memory() {
  return {"memory",
          "memory per rank planned from a config: full fine-tuning and LoRA, ZeRO-1 off and on",
          "memory [CONFIG.toml] [--ranks N] [--set key=value]...\n\n"
          "Plans the memory per rank of a run of CONFIG on N data-parallel ranks (default 1) without running it:\n"
          "the frozen base (LoRA), the trainable weights, gradients and optimizer state as the engines count\n"
          "them in their start-of-run memory lines, and one micro-batch's activations (train.micro_batch_tokens):\n"
          "on the CPU the CPU model's buffers; on the GPU the buffers the CUDA model sizes (the same function,\n"
          "src/model/gpu_buffers.hpp) and the block lists of one document that long, plus an estimate of the\n"
          "CUDA context, cuBLAS and NCCL (the runtime column), which the measured peak includes. Four rows:\n"
          "full and LoRA (the config's [lora], else rank 16), train.zero 0 and 1 (src/model/README.md,\n"
          "\"Planning memory\").\n",
          {{"ranks", 1, "data-parallel ranks (default 1)", "N"}},
          run_memory, kSetFlag};
}

}  // namespace sb
