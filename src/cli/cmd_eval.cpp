// sparsebalance eval: validation loss by length bucket and synthetic-task accuracy, dense and sparse.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "io/shard.hpp"
#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "src/hf/hf_lora.hpp"
#include "base/error.hpp"
#include "src/eval/diagnose.hpp"
#include "src/eval/evaluate.hpp"
#include "src/train/batch.hpp"
#include "src/train/weights.hpp"

namespace sb {

// {"passkey": {correct, total, accuracy}, ..., "overall": {...}} from counts by task type.
static nlohmann::json tasks_json(const std::array<int64_t, 4>& correct, const std::array<int64_t, 4>& total) {
  nlohmann::json tasks = nlohmann::json::object();
  int64_t c = 0, t = 0;
  for (int i = 1; i < 4; ++i) {
    if (!total[i]) continue;
    tasks[task_name(i)] = {{"correct", correct[i]}, {"total", total[i]}, {"accuracy", double(correct[i]) / double(total[i])}};
    c += correct[i], t += total[i];
  }
  tasks["overall"] = {{"correct", c}, {"total", t}, {"accuracy", t ? double(c) / double(t) : 0.0}};
  return tasks;
}

// {correct, total, accuracy}: span_accuracy's counts.
static nlohmann::json span_json(int64_t correct, int64_t total) {
  return {{"correct", correct}, {"total", total}, {"accuracy", total ? double(correct) / double(total) : 0.0}};
}

static int run_eval(const Args& args) {
  Comm comm;
  // The checkpoint carries its config; a config file given here replaces it (model shapes must match).
  std::string ck_path = args.get("checkpoint");
  Config base = Config::load(args.positional.empty() ? "" : args.positional[0], args.sets);
  if (ck_path.empty() || ck_path == "latest") {
    auto all = list_checkpoints(base.s("checkpoint.dir"));
    if (all.empty())
      throw Error("eval: --checkpoint " + std::string(ck_path.empty() ? "not given" : "latest") +
                  ": no checkpoint in checkpoint.dir = " + base.s("checkpoint.dir") +
                  " ('latest' is the newest ckpt_*.h5 there: set checkpoint.dir with CONFIG or --set, or give a path)");
    ck_path = all.front();
  }
  Checkpoint ck = read_checkpoint(ck_path);
  Config cfg = args.positional.empty() ? Config::from_text(ck.config_toml, ck_path + " (stored config)") : base;
  if (args.positional.empty())
    for (const auto& s : args.sets) cfg.set(s.substr(0, s.find('=')), s.substr(s.find('=') + 1), "--set " + s);
  Dataset ds = open_data(data_settings(cfg));  // data.path, or data.sources' mixture
  const Settings st = from_config(cfg, ds.vocab_size());
  Model<float> model(st.model);
  if (const LoraBaseRef ref = read_lora_base_ref(ck_path); !ref.xxh64.empty()) {
    // A LoRA checkpoint: evaluated as its merged model, W + (alpha / rank) B A on its base (the
    // adapted model's function; the base found as `convert --merge` finds it, hash checked).
    std::vector<float> w = lora_merged_weights(ck_path, ck, Config::from_text(ck.config_toml, ck_path + " (stored config)"),
                                               args.get("base", ""));
    if (w.size() != model.weights().size())
      throw Error(ck_path + ": its merged model has " + std::to_string(w.size()) + " parameters, the configured one " +
                  std::to_string(model.weights().size()) + " (different [model] settings or data vocab_size?)");
    model.weights() = std::move(w);
    if (comm.root()) std::printf("eval: LoRA checkpoint %s merged onto its base %s\n", ck_path.c_str(), ref.base.c_str());
  } else {
    if (args.has("base")) throw Error("--base: " + ck_path + " is not a LoRA checkpoint (it holds every weight)");
    load_weights(ck, ck_path, model);
  }
  // On train.device: the GPU evaluates a GPU-sized model in seconds where the CPU would take minutes.
  AdamW opt(st.optim, model.weights().size());  // unused: eval takes no step
  std::unique_ptr<Engine> engine = make_engine(st.engine(), comm, model, opt);
  engine->from_host();
  EvalResult r = evaluate(st, comm, *engine, ds);
  nlohmann::json diag;
  if (args.has("diagnose")) {  // where sparse attention loses the tasks (src/eval/diagnose.hpp)
    diag = diagnose(st, comm, *engine, ds);
    diag["checkpoint"] = ck_path, diag["step"] = ck.step;
  }
  if (!comm.root()) return 0;
  nlohmann::json buckets = nlohmann::json::array();
  for (size_t b = 0; b < r.dense.bucket_loss.size(); ++b) {
    auto lo = b == 0 ? 0 : r.bucket_bounds[b - 1] + 1;
    std::string name = b < r.bucket_bounds.size() ? std::to_string(lo) + "-" + std::to_string(r.bucket_bounds[b])
                                                   : ">" + std::to_string(r.bucket_bounds.empty() ? 0 : r.bucket_bounds.back());
    auto avg = [](double s, int64_t n) { return n ? s / double(n) : 0.0; };
    buckets.push_back({{"lengths", name}, {"targets", r.dense.bucket_targets[b]},
                       {"loss", avg(r.dense.bucket_loss[b], r.dense.bucket_targets[b])},
                       {"loss_sparse", avg(r.sparse.bucket_loss[b], r.sparse.bucket_targets[b])},
                       {"task_accuracy", tasks_json(r.dense.bucket_task_correct[b], r.dense.bucket_task_total[b])},
                       {"task_accuracy_sparse", tasks_json(r.sparse.bucket_task_correct[b], r.sparse.bucket_task_total[b])}});
  }
  nlohmann::json j = {{"checkpoint", ck_path}, {"step", ck.step}, {"docs", r.docs}, {"tokens", r.tokens},
                      {"loss", r.dense.loss()}, {"loss_sparse", r.sparse.loss()}, {"buckets", buckets},
                      {"doc_ids", r.doc_ids}, {"window", cfg.i("train.micro_batch_tokens")}, {"data", st.data.path},
                      {"task_accuracy", tasks_json(r.dense.task_correct, r.dense.task_total)},
                      {"task_accuracy_sparse", tasks_json(r.sparse.task_correct, r.sparse.task_total)}};
  std::printf("eval %s (step %lld): %lld docs, %lld tokens\n", ck_path.c_str(), static_cast<long long>(ck.step),
              static_cast<long long>(r.docs), static_cast<long long>(r.tokens));
  std::printf("  loss dense %.4f | sparse %.4f\n", r.dense.loss(), r.sparse.loss());
  if (!st.data.sources.empty()) {  // a mixture: the loss of each source's validation documents
    nlohmann::json sources = nlohmann::json::array();
    auto avg = [](double s, int64_t n) { return n ? s / double(n) : 0.0; };
    for (size_t i = 0; i < st.data.sources.size(); ++i) {
      const double dense = avg(r.dense.source_loss[i], r.dense.source_targets[i]),
                   sparse = avg(r.sparse.source_loss[i], r.sparse.source_targets[i]);
      sources.push_back({{"path", st.data.sources[i].path}, {"weight", st.data.sources[i].weight},
                         {"docs", r.source_docs[i]}, {"targets", r.dense.source_targets[i]}, {"loss", dense},
                         {"loss_sparse", sparse}});
      std::printf("  source %zu %s: %lld docs, loss dense %.4f | sparse %.4f\n", i, st.data.sources[i].path.c_str(),
                  static_cast<long long>(r.source_docs[i]), dense, sparse);
    }
    j["sources"] = sources;
  }
  if (r.masked) {  // loss masks: the loss over the trained targets (dense), exact match per record
    j["loss_masked"] = r.masked_loss(), j["targets_masked"] = r.masked_targets;
    std::printf("  loss over trained targets (loss mask) %.4f (%lld targets)\n", r.masked_loss(),
                static_cast<long long>(r.masked_targets));
    j["span_accuracy"] = span_json(r.dense.span_correct, r.dense.span_total);
    j["span_accuracy_sparse"] = span_json(r.sparse.span_correct, r.sparse.span_total);
    for (size_t b = 0; b < buckets.size(); ++b) {
      buckets[b]["span_accuracy"] = span_json(r.dense.bucket_span_correct[b], r.dense.bucket_span_total[b]);
      buckets[b]["span_accuracy_sparse"] = span_json(r.sparse.bucket_span_correct[b], r.sparse.bucket_span_total[b]);
    }
    j["buckets"] = buckets;
    std::printf("  span accuracy (records, every trained target right) %.3f (%lld/%lld) | sparse %.3f (%lld)\n",
                j["span_accuracy"]["accuracy"].get<double>(), static_cast<long long>(r.dense.span_correct),
                static_cast<long long>(r.dense.span_total), j["span_accuracy_sparse"]["accuracy"].get<double>(),
                static_cast<long long>(r.sparse.span_correct));
  }
  for (const auto& b : buckets) {
    const auto& all = b["task_accuracy"]["overall"];
    std::printf("  length %-12s loss %.4f | sparse %.4f (%lld targets); tasks %lld/%lld | sparse %lld\n",
                b["lengths"].get<std::string>().c_str(), b["loss"].get<double>(), b["loss_sparse"].get<double>(),
                static_cast<long long>(b["targets"].get<int64_t>()), static_cast<long long>(all["correct"].get<int64_t>()),
                static_cast<long long>(all["total"].get<int64_t>()),
                static_cast<long long>(b["task_accuracy_sparse"]["overall"]["correct"].get<int64_t>()));
  }
  for (auto& [name, t] : j["task_accuracy"].items())
    std::printf("  task %-9s accuracy %.3f (%lld/%lld) | sparse %.3f\n", name.c_str(), t["accuracy"].get<double>(),
                static_cast<long long>(t["correct"].get<int64_t>()), static_cast<long long>(t["total"].get<int64_t>()),
                j["task_accuracy_sparse"][name]["accuracy"].get<double>());
  if (args.has("summary")) write_summary(args.get("summary"), j);
  if (args.has("diagnose")) {
    const auto& a = diag["accuracy"];
    std::printf("  diagnose: %lld task docs (%lld with the needle in the window); overall dense %.3f | sparse %.3f | "
                "oracle gate %.3f\n", static_cast<long long>(diag["docs"].get<int64_t>()),
                static_cast<long long>(diag["docs_with_needle"].get<int64_t>()), a["dense"]["overall"]["accuracy"].get<double>(),
                a["sparse"]["overall"]["accuracy"].get<double>(), a["oracle"]["overall"]["accuracy"].get<double>());
    for (const auto& l : diag["layers"]) {
      const int i = l["layer"].get<int>();
      auto num = [](const nlohmann::json& v) { return v.is_null() ? -1.0 : v.get<double>(); };
      std::printf("  layer %d: needle rank %.1f of %.1f, kept %.3f | recall true %.3f gate %.3f (answer rows), true %.3f "
                  "gate %.3f (sampled) | only this layer dense %.3f, only this layer sparse %.3f\n",
                  i, num(l["needle_rank"]), num(l["candidates"]), num(l["needle_kept"]), num(l["recall_true_answer"]),
                  num(l["recall_gate_answer"]), num(l["recall_true_sampled"]), num(l["recall_gate_sampled"]),
                  a["dense_layer"][size_t(i)]["overall"]["accuracy"].get<double>(),
                  a["sparse_layer"][size_t(i)]["overall"]["accuracy"].get<double>());
    }
    write_summary(args.get("diagnose"), diag);
  }
  return 0;
}

Command cmd_eval() {
  return {"eval",
          "validation loss by length and task accuracy, dense and sparse",
          "eval [CONFIG.toml] --checkpoint PATH|latest [--set key=value]... [--summary PATH]\n\n"
          "Evaluates eval.docs documents of the validation split (data.val_fraction, data.seed): next-token\n"
          "loss per document-length bucket (eval.buckets) and exact-match accuracy of greedy predictions\n"
          "over the synthetic tasks' answer spans (teacher-forced), with dense and with sparse attention\n"
          "(attention.k, attention.theta). Data with loss masks (prompt/response or chat records, prep synth\n"
          "--mask answers) also get span_accuracy: a record is right when every trained target is the greedy\n"
          "prediction. A mixture (data.sources) also gets the loss of each source (JSON \"sources\").\n"
          "Without CONFIG the checkpoint's stored config is used. --diagnose PATH: where sparse\n"
          "attention loses the synthetic tasks' retrieval, per layer and kv head (bench/analysis/diagnose_table.py).\n"
          "A LoRA checkpoint is evaluated merged onto its base (src/model/README.md, \"LoRA\"; --base PATH).\n",
          {{"checkpoint", 1, "checkpoint file, or 'latest' in checkpoint.dir", "PATH"},
           {"base", 1, "a LoRA checkpoint's base (HF directory or checkpoint) when not where the checkpoint says; XXH64 checked", "PATH"},
           {"diagnose", 1, "also the sparse-retrieval diagnostics of the task documents (needle ranks, oracle gate, true "
                           "against gate recall, per-layer ablation) as JSON (README.md, eval --diagnose)", "PATH"}},
          run_eval};
}

}  // namespace sb
