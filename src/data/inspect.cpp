#include "src/data/inspect.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

#include "base/error.hpp"
#include "src/data/bpe_tokenizer.hpp"
#include "src/data/tokenizer.hpp"

namespace sb {

namespace {

// Nearest-rank percentile of sorted values (p in (0, 1]).
uint64_t percentile(const std::vector<uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t k = size_t(std::ceil(p * double(sorted.size())));
  return sorted[std::clamp<size_t>(k, 1, sorted.size()) - 1];
}

std::string fmt(const char* f, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

}  // namespace

nlohmann::json dataset_report(const Dataset& ds, bool verify) {
  if (verify) ds.verify();
  nlohmann::json r;
  r["path"] = ds.path();
  r["format"] = kShardFormat;
  r["version"] = kShardVersion;
  r["verified"] = verify;
  r["shards"] = ds.shards().size();
  r["shard_files"] = nlohmann::json::array();
  for (const auto& s : ds.shards()) r["shard_files"].push_back(s.path());
  r["documents"] = ds.num_docs();
  r["tokens"] = ds.num_tokens();
  r["vocab_size"] = ds.vocab_size();
  r["tokenizer"] = ds.tokenizer();
  r["eos_id"] = ds.eos_id();

  auto sorted = ds.doc_lengths();
  std::sort(sorted.begin(), sorted.end());
  r["lengths"] = {{"min", sorted.empty() ? 0 : sorted.front()}, {"median", percentile(sorted, 0.5)},
                  {"p90", percentile(sorted, 0.9)},             {"p99", percentile(sorted, 0.99)},
                  {"max", sorted.empty() ? 0 : sorted.back()},
                  {"mean", sorted.empty() ? 0.0 : double(ds.num_tokens()) / double(sorted.size())}};
  // log2 buckets [2^b, 2^(b+1)); empty documents in a bucket [0, 1).
  std::vector<uint64_t> counts(66, 0);
  for (auto len : sorted) counts[len == 0 ? 0 : std::bit_width(len)]++;
  auto& hist = r["histogram"] = nlohmann::json::array();
  for (size_t b = 0; b < counts.size(); ++b) {
    if (!counts[b]) continue;
    uint64_t lo = b == 0 ? 0 : uint64_t(1) << (b - 1);
    hist.push_back({{"lo", lo}, {"hi", b == 0 ? 1 : 2 * lo}, {"count", counts[b]}});
  }
  std::vector<uint64_t> tasks(kNumTaskTypes, 0);
  for (uint64_t d = 0; d < ds.num_docs(); ++d) tasks[ds.task(d).type]++;
  for (int t = 0; t < kNumTaskTypes; ++t) r["tasks"][task_name(t)] = tasks[t];
  // Targets (position t predicts token t+1) and how many of them the loss mask trains.
  uint64_t targets = 0, trained = 0;
  for (uint64_t d = 0; d < ds.num_docs(); ++d) {
    uint64_t len = ds.doc_length(d);
    if (len < 2) continue;
    targets += len - 1;
    if (!ds.has_masks()) continue;
    auto m = ds.read_mask(d, 0, len);
    for (size_t i = 1; i < m.size(); ++i) trained += m[i];
  }
  r["loss_mask"] = ds.has_masks();
  r["targets"] = targets;
  r["trained_targets"] = ds.has_masks() ? trained : targets;
  return r;
}

std::string format_dataset_report(const nlohmann::json& r) {
  std::string out;
  out += fmt("%s: SparseBalance token dataset (%s v%d)%s\n", r["path"].get<std::string>().c_str(), kShardFormat,
             int(kShardVersion), r["verified"].get<bool>() ? ", token ids verified" : "");
  out += fmt("  shards      %llu\n", (unsigned long long)r["shards"].get<uint64_t>());
  out += fmt("  documents   %llu\n", (unsigned long long)r["documents"].get<uint64_t>());
  out += fmt("  tokens      %llu\n", (unsigned long long)r["tokens"].get<uint64_t>());
  out += fmt("  vocab       %lld (tokenizer %s, eos_id %lld)\n", (long long)r["vocab_size"].get<int64_t>(),
             r["tokenizer"].get<std::string>().c_str(), (long long)r["eos_id"].get<int64_t>());
  const auto& L = r["lengths"];
  out += fmt("  lengths     min %llu  median %llu  p90 %llu  p99 %llu  max %llu  mean %.1f\n",
             (unsigned long long)L["min"].get<uint64_t>(), (unsigned long long)L["median"].get<uint64_t>(),
             (unsigned long long)L["p90"].get<uint64_t>(), (unsigned long long)L["p99"].get<uint64_t>(),
             (unsigned long long)L["max"].get<uint64_t>(), L["mean"].get<double>());
  out += "  length histogram (log2 buckets, tokens):\n";
  uint64_t peak = 1;
  for (const auto& h : r["histogram"]) peak = std::max(peak, h["count"].get<uint64_t>());
  for (const auto& h : r["histogram"]) {
    uint64_t c = h["count"].get<uint64_t>();
    int bar = int(std::ceil(40.0 * double(c) / double(peak)));
    out += fmt("    [%8llu, %8llu)  %8llu  %s\n", (unsigned long long)h["lo"].get<uint64_t>(),
               (unsigned long long)h["hi"].get<uint64_t>(), (unsigned long long)c, std::string(bar, '#').c_str());
  }
  out += "  tasks      ";
  for (int t = 0; t < kNumTaskTypes; ++t)
    out += fmt(" %s %llu", task_name(t), (unsigned long long)r["tasks"][task_name(t)].get<uint64_t>());
  out += "\n";
  if (r["loss_mask"].get<bool>())
    out += fmt("  loss mask   %llu of %llu targets trained\n", (unsigned long long)r["trained_targets"].get<uint64_t>(),
               (unsigned long long)r["targets"].get<uint64_t>());
  return out;
}

std::string decode_document(const Dataset& ds, uint64_t doc, const std::string& tokenizer_path) {
  if (doc >= ds.num_docs())
    throw Error(ds.path() + ": --decode " + std::to_string(doc) + ": the dataset has " + std::to_string(ds.num_docs()) +
                " documents (0.." + std::to_string(ds.num_docs() ? ds.num_docs() - 1 : 0) + ")");
  auto ids = ds.read_doc(doc);
  if (ds.tokenizer() == ByteTokenizer::kName) return ByteTokenizer::decode(ids);
  std::string want = shard_tokenizer_sha256(ds.tokenizer());
  if (want.empty())
    throw Error(ds.path() + ": tokenizer \"" + ds.tokenizer() + "\" is neither the byte tokenizer nor a tokenizer.json "
                "(no sha256 recorded): cannot decode");
  if (tokenizer_path.empty())
    throw Error(ds.path() + ": made with tokenizer " + ds.tokenizer() + "; --decode needs that file: --tokenizer tokenizer.json");
  auto tok = BpeTokenizer::load(tokenizer_path);
  if (tok.sha256() != want)
    throw Error(tokenizer_path + ": sha256 " + tok.sha256() + " differs from the " + want + " that " + ds.path() +
                " records (--tokenizer must be the file the shards were made with)");
  return tok.decode(ids);
}

}  // namespace sb
