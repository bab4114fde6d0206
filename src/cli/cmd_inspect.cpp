// `sparsebalance inspect PATH [--json]`: what is in a file. Dispatches on the root attribute
// `format` (a directory is judged by its first *.h5 file): shards and datasets here; checkpoints
// and metrics logs get their own branches.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "io/h5.hpp"
#include "io/latency_profile.hpp"
#include "io/metrics_log.hpp"
#include "io/shard.hpp"
#include "src/balance/latency_model.hpp"
#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "base/error.hpp"
#include "src/data/inspect.hpp"

namespace sb {

namespace {

// The root `format` attribute of PATH (or of the first *.h5 file of a directory).
std::string file_format(const std::string& path) {
  std::string file = std::filesystem::is_directory(path) ? shard_files(path).front() : path;
  h5::quiet_errors();
  // A metrics log being written (SWMR) opens only in SWMR-read mode.
  h5::Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
  h5::check_file(file, "a sparsebalance HDF5 file (shard, checkpoint, metrics log or latency profile)");
  hid_t swmr = std::filesystem::exists(file) ? H5Fopen(file.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl) : -1;
  h5::Id f = swmr >= 0 ? h5::Id(swmr) : h5::open_read_checked(file);
  if (h5::has_attr(f, "format")) return h5::read_attr_string(f, "format", file);
  // A latency profile (sparsebalance profile --output) keeps its format on the group /latency.
  if (H5Lexists(f, "latency", H5P_DEFAULT) > 0) {
    h5::Id g(H5Gopen2(f, "latency", H5P_DEFAULT));
    if (g >= 0 && h5::has_attr(g, "format")) return h5::read_attr_string(g, "format", file);
  }
  return "";
}

int inspect_latency(const std::string& path, bool json) {
  const LatencyProfile p = load_latency_profile_file(path);
  nlohmann::json j = {{"path", path}, {"format", "sparsebalance-latency"}, {"device", p.device},
                      {"n_layers", p.n_layers}, {"block_size", p.block_size}, {"local_blocks", p.local_blocks},
                      {"density", p.density}};
  for (int i = 0; i < kLatencyParts; ++i)
    j["parts"][part_name(Part(i))] = {{"coeffs_ms", p.coeffs[i]}, {"correction", p.correction[i]},
                            {"heldout_error", p.heldout_error[i]}, {"samples", p.samples[i]}};
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: SparseBalance latency profile, device %s, measured for %lld layers, blocks of %lld, %lld local "
              "block(s), learned density %.3f\n", path.c_str(), p.device.c_str(), (long long)p.n_layers,
              (long long)p.block_size, (long long)p.local_blocks, p.density);
  std::printf("  %-10s %12s %12s %12s %10s %9s %8s\n", "part", "c0 ms", "c1", "c2", "correction", "held-out", "samples");
  for (int i = 0; i < kLatencyParts; ++i)
    std::printf("  %-10s %12.4g %12.4g %12.4g %10.3f %8.0f%% %8lld\n", part_name(Part(i)), p.coeffs[i][0], p.coeffs[i][1],
                p.coeffs[i][2], p.correction[i], 100 * p.heldout_error[i], (long long)p.samples[i]);
  return 0;
}

int inspect_dataset(const std::string& path, bool json, const Args& args) {
  auto ds = Dataset::open(path);
  if (args.has("decode")) {
    const uint64_t doc = uint64_t(args.integer("decode", 0, INT64_MAX, "a document index (0, 1, ...)"));
    std::string text = decode_document(ds, doc, args.get("tokenizer"));
    if (json)
      std::printf("%s\n", nlohmann::json({{"path", path}, {"doc", doc}, {"tokens", ds.doc_length(doc)}, {"text", text}})
                              .dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    else
      std::fwrite(text.data(), 1, text.size(), stdout), std::printf("\n");
    return 0;
  }
  auto report = dataset_report(ds, /*verify=*/true);
  if (json) std::printf("%s\n", report.dump(2).c_str());
  else std::printf("%s", format_dataset_report(report).c_str());
  return 0;
}

int inspect_checkpoint(const std::string& path, bool json) {
  nlohmann::json lat;
  Checkpoint ck = read_checkpoint(path, [&](hid_t f) {
    if (!h5::exists(f, "latency")) return;
    h5::Id g = h5::group(f, "latency", false);
    LatencyModel lm = LatencyModel::load(g, path);
    const auto& p = lm.profile();
    lat = {{"device", p.device}, {"density", p.density}};
    for (int part = 0; part < kLatencyParts; ++part)
      lat[part_name(Part(part))] = {{"coeffs", p.coeffs[size_t(part)]}, {"correction", p.correction[size_t(part)]},
                                    {"heldout_error", p.heldout_error[size_t(part)]}};
  });
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : ck.tensors) tensors.push_back({{"name", t.name}, {"shape", t.shape}});
  nlohmann::json j = {{"path", path}, {"format", "sparsebalance-checkpoint"}, {"step", ck.step}, {"ranks", ck.ranks},
                      {"parameters", ck.params.size()}, {"tensors", tensors}, {"data_epoch", ck.data_epoch},
                      {"data_cursor", ck.data_cursor}, {"checksum", "verified"}, {"latency_model", lat},
                      {"config", ck.config_toml}};
  if (!ck.source_epochs.empty()) j["sources"] = {{"epoch", ck.source_epochs}, {"index", ck.source_indexes}, {"draws", ck.data_draws}};
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: SparseBalance checkpoint, checksum verified\n", path.c_str());
  std::printf("  step %lld, written by %lld rank(s)", static_cast<long long>(ck.step), static_cast<long long>(ck.ranks));
  if (ck.source_epochs.empty())  // data.path: one cursor; a mixture: one per source, below
    std::printf(", data cursor epoch %lld doc %lld", static_cast<long long>(ck.data_epoch), static_cast<long long>(ck.data_cursor));
  std::printf("\n");
  for (size_t i = 0; i < ck.source_epochs.size(); ++i)  // data.sources: each source's own cursor
    std::printf("  data source %zu: epoch %lld doc %lld%s\n", i, static_cast<long long>(ck.source_epochs[i]),
                static_cast<long long>(ck.source_indexes[i]),
                i + 1 == ck.source_epochs.size() ? (" (" + std::to_string(ck.data_draws) + " documents drawn)").c_str() : "");
  std::printf("  %zu parameters in %zu tensors (+ AdamW moments m, v):\n", ck.params.size(), ck.tensors.size());
  for (const auto& t : ck.tensors) {
    std::string shape;
    for (auto d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    std::printf("    %-52s (%s)\n", t.name.c_str(), shape.c_str());
  }
  if (!lat.is_null()) {
    std::printf("  latency model (%s), corrections:", lat["device"].get<std::string>().c_str());
    for (int part = 0; part < kLatencyParts; ++part)
      std::printf(" %s %.3f", part_name(Part(part)), lat[part_name(Part(part))]["correction"].get<double>());
    std::printf(", density %.3f\n", lat["density"].get<double>());
  }
  std::printf("  config:\n");
  std::string cfg = ck.config_toml;
  for (size_t a = 0, b; a < cfg.size(); a = b + 1) {
    b = cfg.find('\n', a);
    if (b == std::string::npos) b = cfg.size();
    std::printf("    %s\n", cfg.substr(a, b - a).c_str());
  }
  return 0;
}

int inspect_metrics(const std::string& path, bool json) {
  MetricsTables t = read_metrics(path);
  const size_t n = t.steps.size();
  const int R = t.n_ranks;
  // Per-rank means over the logged steps: where the time went on each rank.
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < R; ++r) {
    double compute = 0, idle = 0, pred = 0, budget = 0, dens = 0, rec = 0;
    for (size_t s = 0; s < n; ++s) {
      const RankRow& x = t.ranks[s * size_t(R) + size_t(r)];
      compute += x.compute_ms, idle += x.idle_ms, pred += x.predicted_ms, budget += x.mean_budget, dens += x.density, rec += x.recall;
    }
    double d = n ? double(n) : 1.0;
    ranks.push_back({{"rank", r}, {"compute_ms", compute / d}, {"idle_ms", idle / d}, {"predicted_ms", pred / d},
                     {"mean_budget", budget / d}, {"density", dens / d}, {"recall", rec / d}});
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : t.steps)
    steps.push_back({{"step", s.step}, {"loss", s.loss}, {"grad_norm", s.grad_norm}, {"lr", s.lr}, {"tokens", s.tokens},
                     {"makespan_ms", s.makespan_ms}, {"tokens_per_s", s.tokens_per_s}, {"imbalance", s.imbalance},
                     {"bubble", s.bubble}, {"density", s.density}, {"recall", s.recall}, {"plan_ms", s.plan_ms},
                     {"pred_error", s.pred_error}, {"skipped", s.skipped}});
  // data.sources (/sources): each source's documents and tokens over the logged steps, and their shares.
  nlohmann::json sources = nlohmann::json::array();
  const int S = t.n_sources;
  std::vector<int64_t> docs(size_t(S), 0), tokens(size_t(S), 0);
  int64_t all_docs = 0, all_tokens = 0;
  for (size_t s = 0; s < n && S > 0; ++s)
    for (int i = 0; i < S; ++i) {
      const SourceRow& x = t.sources[s * size_t(S) + size_t(i)];
      docs[size_t(i)] += x.docs, tokens[size_t(i)] += x.tokens, all_docs += x.docs, all_tokens += x.tokens;
    }
  for (int i = 0; i < S; ++i)
    sources.push_back({{"source", i}, {"docs", docs[size_t(i)]}, {"tokens", tokens[size_t(i)]},
                       {"share_docs", all_docs ? double(docs[size_t(i)]) / double(all_docs) : 0.0},
                       {"share_tokens", all_tokens ? double(tokens[size_t(i)]) / double(all_tokens) : 0.0}});
  if (json) {
    nlohmann::json j = {{"path", path}, {"format", "sparsebalance-metrics"}, {"steps", steps}, {"ranks", ranks}};
    if (S > 0) j["sources"] = sources;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: SparseBalance metrics log, %zu steps x %d ranks\n", path.c_str(), n, R);
  std::printf("  %6s %9s %8s %9s %10s %9s %6s %6s %6s %6s %8s\n", "step", "loss", "gnorm", "lr", "ms", "tok/s", "imb",
              "bubble", "dens", "recall", "pred_err");
  for (size_t i = n > 10 ? n - 10 : 0; i < n; ++i) {
    const StepRow& s = t.steps[i];
    std::printf("  %6lld %9.4f %8.3f %9.2e %10.1f %9.0f %6.2f %6.3f %6.3f %6.3f %8.3f%s\n", static_cast<long long>(s.step),
                s.loss, s.grad_norm, s.lr, s.makespan_ms, s.tokens_per_s, s.imbalance, s.bubble, s.density, s.recall,
                s.pred_error, s.skipped ? "  (skipped)" : "");
  }
  std::printf("  per rank (means over steps):\n  %5s %11s %9s %13s %7s %6s %6s\n", "rank", "compute_ms", "idle_ms",
              "predicted_ms", "budget", "dens", "recall");
  for (const auto& r : ranks)
    std::printf("  %5d %11.1f %9.1f %13.1f %7.2f %6.3f %6.3f\n", r["rank"].get<int>(), r["compute_ms"].get<double>(),
                r["idle_ms"].get<double>(), r["predicted_ms"].get<double>(), r["mean_budget"].get<double>(),
                r["density"].get<double>(), r["recall"].get<double>());
  if (S > 0) {
    std::printf("  per data source (data.sources, over the logged steps):\n  %6s %9s %11s %10s %12s\n", "source", "docs",
                "tokens", "share_docs", "share_tokens");
    for (const auto& x : sources)
      std::printf("  %6d %9lld %11lld %10.3f %12.3f\n", x["source"].get<int>(), static_cast<long long>(x["docs"].get<int64_t>()),
                  static_cast<long long>(x["tokens"].get<int64_t>()), x["share_docs"].get<double>(), x["share_tokens"].get<double>());
  }
  return 0;
}

int run(const Args& args) {
  Comm comm;
  if (args.positional.size() != 1)
    throw Error("sparsebalance inspect: expected one PATH (a shard, a dataset directory), got " +
                std::to_string(args.positional.size()) + " (see sparsebalance inspect --help)");
  const std::string& path = args.positional[0];
  int rc = 0;
  if (comm.root()) {  // one rank reads and prints; the others only wait
    std::string format = file_format(path);
    if (format != kShardFormat && (args.has("decode") || args.has("tokenizer")))
      throw Error(path + ": --decode and --tokenizer apply to a shard or dataset; this is " +
                  (format.empty() ? std::string("not one") : "a " + format + " file"));
    if (format == kShardFormat) rc = inspect_dataset(path, args.has("json"), args);
    else if (format == "sparsebalance-checkpoint") rc = inspect_checkpoint(path, args.has("json"));
    else if (format == "sparsebalance-metrics") rc = inspect_metrics(path, args.has("json"));
    else if (format == "sparsebalance-latency") rc = inspect_latency(path, args.has("json"));
    else throw Error(path + ": not a SparseBalance shard/dataset, checkpoint, metrics log or latency profile (format attribute '" + format + "')");
  }
  comm.barrier();
  return rc;
}

}  // namespace

Command cmd_inspect() {
  return {"inspect",
          "print what a shard, dataset, checkpoint, metrics log or latency profile holds",
          "inspect PATH [--json] [--decode DOC [--tokenizer tokenizer.json]]\n\n"
          "PATH is a shard file or a directory of shards: documents, tokens, vocabulary, tokenizer, shards,\n"
          "document length statistics (min, median, p90, p99, max, mean), a log2 length histogram and task\n"
          "counts, after checking every token id against vocab_size.\n"
          "--decode DOC prints document DOC (0-based, over the dataset) as text instead: byte shards as they\n"
          "are, BPE shards with --tokenizer, the tokenizer.json they were made with (its sha256 is checked).\n"
          "A checkpoint (ckpt_<step>.h5): step, ranks, data cursor, every tensor's name and shape, the latency\n"
          "model and the stored config, after verifying its checksum.\n"
          "A metrics log: the last steps (loss, time, imbalance, bubble, density, recall, prediction error)\n"
          "and per-rank means of compute, idle and predicted time, budget, density and recall.\n"
          "A latency profile (profile --output): the device, the model shape it was measured for, and per part\n"
          "(attention, gating, linear, all-reduce) its coefficients, online correction, held-out error, samples.\n",
          {{"json", 0, "print the report as JSON on stdout", ""},
           {"decode", 1, "print document DOC of a dataset as text", "DOC"},
           {"tokenizer", 1, "with --decode: the tokenizer.json of BPE shards", "FILE"}},
          run, 0};
}

}  // namespace sb
