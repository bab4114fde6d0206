// sparsebalance train: the training run (DESIGN.md, "The step").
#include <csignal>
#include <filesystem>
#include <cstdio>

#include <nlohmann/json.hpp>
#include <openblas_config.h>

#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "base/error.hpp"
#include "io/dir_lock.hpp"
#include "src/hf/hf_convert.hpp"
#include "src/hf/hf_lora.hpp"
#include "src/train/trainer.hpp"

extern "C" void openblas_set_num_threads(int);

namespace sb {

static void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// A step number given on the command line: a whole number >= 1, or an error naming the flag.
static int64_t positive_flag(const Args& args, const std::string& flag) {
  const std::string text = args.get(flag);
  size_t pos = 0;
  long long x = 0;
  try {
    x = std::stoll(text, &pos, 10);
  } catch (...) {
    pos = 0;
  }
  if (text.empty() || pos != text.size() || x < 1)
    throw Error("train: --" + flag + " '" + text + "': expected a step number >= 1");
  return x;
}

// The summary's "sources" (data.sources): each source's documents and tokens drawn over the steps
// this run ran, their shares of all drawn, and the weight (normalised) they were drawn by.
static nlohmann::json sources_json(const DataSettings& d, const TrainResult& r) {
  int64_t docs = 0, tokens = 0;
  for (size_t i = 0; i < r.source_docs.size(); ++i) docs += r.source_docs[i], tokens += r.source_tokens[i];
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < r.source_docs.size(); ++i)
    out.push_back({{"path", d.sources[i].path}, {"weight", d.sources[i].weight}, {"docs", r.source_docs[i]},
                   {"tokens", r.source_tokens[i]}, {"share_docs", docs ? double(r.source_docs[i]) / double(docs) : 0.0},
                   {"share_tokens", tokens ? double(r.source_tokens[i]) / double(tokens) : 0.0}});
  return out;
}

static int run_train(const Args& args) {
  if (args.positional.size() > 1) throw Error("train: expected at most one config file, got " + std::to_string(args.positional.size()));
  Config cfg = Config::load(args.positional.empty() ? "" : args.positional[0], args.sets);
  if (cfg.i("train.steps") == 0)
    throw Error("train.steps = 0: nothing to train (train.steps is the total number of steps, e.g. --set train.steps=100)");
  Comm comm;
  if (cfg.i("train.threads") > 0) openblas_set_num_threads(int(cfg.i("train.threads")));
  // A scheduler's warning signal (Slurm --signal=B:USR1@N, or SIGTERM at preemption): finish the
  // step, write a checkpoint, exit cleanly so the job can requeue and resume.
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  // One run owns checkpoint.dir: rank 0 holds its lock until the run ends (io/dir_lock.hpp); a
  // second run is refused naming the holder, a lock left by a killed job is free.
  DirLock lock;
  {
    std::string err, stale;
    if (comm.root()) try {
        std::string command = "sparsebalance train";
        for (const auto& p : args.positional) command += " " + p;
        if (args.has("resume")) command += " --resume";
        lock = DirLock(cfg.s("checkpoint.dir"), command + ", " + std::to_string(comm.size()) + " rank(s)", &stale);
      } catch (const std::exception& e) {
        err = e.what();
      }
    comm.broadcast(err);
    if (!err.empty()) throw Error(err);
    if (comm.root() && !lock.why().empty())
      std::fprintf(stderr, lock.held() ? "warning: %s\n" : "warning: checkpoint.dir is not guarded against a second run: %s\n",
                   lock.why().c_str());
    if (!stale.empty())
      std::printf("note: %s was left by a run that ended without releasing it (%s); that run holds no lock any more, "
                  "this one took it\n", lock.path().c_str(), stale.c_str());
  }
  std::string resume;
  if (args.has("resume")) resume = args.get("resume", "").empty() ? "latest" : args.get("resume");
  const int64_t stop_at = args.has("stop-at") ? positive_flag(args, "stop-at") : 0;
  if (comm.root())
    std::printf("train: %d rank(s), config %s, data %s, batching %s, tuning %s, attention %s\n", comm.size(),
                cfg.source().empty() ? "(defaults)" : cfg.source().c_str(), data_settings(cfg).path.c_str(),
                cfg.s("balance.batching").c_str(), cfg.s("balance.tuning").c_str(), cfg.s("attention.mode").c_str());
  // --init-from: the model shape and weights from an HF directory or a checkpoint, a fresh optimizer.
  std::vector<float> init;
  // --init-from ADAPTER_DIR (PEFT LoRA): the base its adapter_config.json names, then the adapters
  std::string adapter, init_path = args.get("init-from", "");
  if (args.has("init-from")) {
    if (!(adapter = peft_adapter_base(init_path, cfg)).empty()) std::swap(adapter, init_path);
    std::vector<std::string> notes;
    init = init_weights_from(init_path, cfg, args.sets, &notes);
    if (comm.root())
      for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  }
  Trainer trainer(cfg, comm, resume, stop_at, /*weights_given=*/args.has("init-from"));
  if (args.has("init-from")) {
    // the absolute path: a LoRA checkpoint names its base by it (convert --merge finds it from elsewhere)
    const std::string from = std::filesystem::absolute(init_path).lexically_normal().string();
    const bool used = trainer.set_initial_weights(std::move(init), from);
    if (comm.root() && trainer.settings().lora.on())
      std::printf("init-from: the frozen base of the LoRA adapters is %s (XXH64 %s)\n", from.c_str(),
                  trainer.base_xxh64().c_str());
    else if (comm.root())
      std::printf(used ? "init-from: weights of %s, fresh optimizer\n" : "init-from: %s not used: resumed from a checkpoint\n",
                  args.get("init-from").c_str());
    if (!adapter.empty()) {
      if (!trainer.settings().lora.on()) throw Error("--init-from " + adapter + ": a PEFT adapter needs lora.rank > 0");
      if (const std::string h = peft_adapter_base_xxh64(adapter); !h.empty() && h != trainer.base_xxh64())
        throw Error("--init-from " + adapter + ": its adapters were trained on a base with XXH64 " + h + " (" + adapter +
                    "/sparsebalance_lora.json), but " + from + " has XXH64 " + trainer.base_xxh64());
      const bool fresh = trainer.set_initial_adapters(read_peft_adapter(adapter, trainer.model()));
      if (comm.root())
        std::printf(fresh ? "init-from: the LoRA adapters of %s, fresh optimizer\n"
                          : "init-from: the adapters of %s not used: resumed from a checkpoint\n", adapter.c_str());
    }
  }
  if (comm.root())
    std::printf("model: %lld parameters (%d layers, d_model %d, %d heads, %d kv heads, vocab %d)\n",
                static_cast<long long>(trainer.model().shape().num_params()), trainer.model().shape().n_layers,
                trainer.model().shape().d_model, trainer.model().shape().n_heads, trainer.model().shape().n_kv_heads,
                trainer.model().shape().vocab);
  TrainResult r = trainer.run();
  if (comm.root()) {
    if (r.last_step < r.first_step)  // resumed at or past train.steps
      std::printf("done: nothing to do: the checkpoint is at step %lld and train.steps = %lld (raise train.steps to go on)\n",
                  static_cast<long long>(r.first_step - 1), static_cast<long long>(trainer.settings().train.steps));
    else {
      std::printf("done: steps %lld..%lld, loss %.4f -> %.4f, %.0f tok/s, mean imbalance %.3f",
                  static_cast<long long>(r.first_step), static_cast<long long>(r.last_step), r.first_loss, r.last_loss,
                  r.tokens_per_s, r.mean_imbalance);
      if (r.mfu > 0) std::printf(", mfu %.1f%%", 100 * r.mfu);  // a peak is known (train.peak_tflops or cuda)
      if (r.peak_mem_gib > 0) std::printf(", peak device memory %.2f GiB", r.peak_mem_gib);
      std::printf("\n");
    }
    if (!r.source_docs.empty()) {  // data.sources: what the steps drew from each source against its weight
      std::printf("data mixture (documents drawn, share against weight):");
      for (const auto& x : sources_json(data_settings(cfg), r))
        std::printf(" %s %lld (%.3f / %.3f)", x["path"].get<std::string>().c_str(),
                    static_cast<long long>(x["docs"].get<int64_t>()), x["share_docs"].get<double>(), x["weight"].get<double>());
      std::printf("\n");
    }
    std::printf("checkpoint: %s\nmetrics log: %s\ninspect them: sparsebalance inspect %s ; sparsebalance inspect %s\n",
                r.checkpoint.c_str(), r.log.c_str(), r.checkpoint.c_str(), r.log.c_str());
    if (args.has("summary")) {
      nlohmann::json j = {{"steps", r.last_step >= r.first_step ? r.last_step - r.first_step + 1 : 0},
                          {"first_step", r.first_step},
                          {"last_step", r.last_step},
                          {"first_loss", r.first_loss},
                          {"last_loss", r.last_loss},
                          {"losses", r.losses},
                          {"step_ms", r.step_ms},
                          {"tokens_per_s", r.tokens_per_s},
                          {"mean_step_ms", r.mean_step_ms},
                          {"mean_imbalance", r.mean_imbalance},
                          {"mean_bubble", r.mean_bubble},
                          {"mean_density", r.mean_density},
                          {"mean_recall", r.mean_recall},
                          {"mean_recall_true", r.mean_recall_true},
                          {"mean_pred_error", r.mean_pred_error},
                          {"mfu", r.mfu},
                          {"peak_mem_gib", r.peak_mem_gib},
                          {"budgets_above_k0", r.budgets_above_k0},
                          {"budgets_below_k0", r.budgets_below_k0},
                          {"ranks", comm.size()},
                          {"batching", cfg.s("balance.batching")},
                          {"tuning", cfg.s("balance.tuning")},
                          {"attention", cfg.s("attention.mode")},
                          {"device", cfg.s("train.device")},
                          {"stopped_early", r.stopped_early},
                          {"checkpoint", r.checkpoint},
                          {"log", r.log}};
      if (!r.source_docs.empty()) j["sources"] = sources_json(data_settings(cfg), r);
      write_summary(args.get("summary"), j);
    }
  }
  return 0;
}

Command cmd_train() {
  return {"train",
          "train a model (MPI data parallel, SparseBalance)",
          "train [CONFIG.toml] [--set key=value]... [--resume [PATH|latest]] [--init-from PATH] [--stop-at STEP]\n"
          "      [--summary PATH]\n\n"
          "Trains on the shards of data.path (or the weighted mixture data.sources) for train.steps steps.\n"
          "Every step: plan (batching), predict, exchange, tune (DST), compute, reduce, update, measure, record.\n"
          "Writes checkpoints to checkpoint.dir every checkpoint.every steps and a metrics log to log.path.\n"
          "--resume continues from a checkpoint (latest in checkpoint.dir when no PATH is given) with\n"
          "the same results as an uninterrupted run. SIGUSR1/SIGTERM: finish the step, checkpoint, exit 0.\n"
          "--init-from starts from the weights of an HF directory or a checkpoint (io/SAFETENSORS.md) with a\n"
          "fresh optimizer; the [model] shape comes from PATH (a --set model.* that contradicts it is an\n"
          "error). With --resume, a checkpoint found wins and --init-from is not used (a requeued job resumes).\n",
          {{"resume", -2, "continue from a checkpoint: PATH, or 'latest' in checkpoint.dir (default)", "[PATH]"},
           {"stop-at", 1, "stop after this step (writing a checkpoint), like a preempted job", "STEP"},
           {"init-from", 1, "start from these weights: an HF model directory or a checkpoint .h5; with lora.rank > 0 the frozen base, or a PEFT adapter directory (its base_model_name_or_path the base)", "PATH"}},
          run_train};
}

}  // namespace sb
