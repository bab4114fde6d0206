// Shard read throughput next to a plain fread of the same bytes from a raw binary file:
// whole long documents (sequential) and random small documents (what a training step draws).
// Both files are freshly written, so both read from the page cache: this measures the HDF5
// hyperslab path's overhead, not the disk.
//   ./build/bench/bench_shard --benchmark_min_time=1
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "io/shard.hpp"
#include "src/data/synth.hpp"

namespace {

struct Files {
  std::string dir, shard, raw;
  std::vector<uint64_t> offsets;
};

// One shard + one raw file with the same uint32 tokens; docs of the given lengths.
Files make(const std::string& name, const std::vector<uint64_t>& lengths) {
  Files f;
  f.dir = (std::filesystem::temp_directory_path() / ("sb_bench_shard_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(f.dir);
  f.shard = f.dir + "/" + name + ".h5", f.raw = f.dir + "/" + name + ".bin";
  sb::ShardWriter w(f.shard, {259, "byte", 257});
  FILE* raw = std::fopen(f.raw.c_str(), "wb");
  f.offsets = {0};
  sb::Rng rng(1);
  std::vector<uint32_t> doc;
  for (auto len : lengths) {
    doc.resize(len);
    for (auto& t : doc) t = uint32_t(rng.below(256));
    w.add(doc);
    std::fwrite(doc.data(), 4, doc.size(), raw);
    f.offsets.push_back(f.offsets.back() + len);
  }
  w.close();
  std::fclose(raw);
  return f;
}

const Files& long_docs() {  // 32 documents of 256K tokens (32 MiB)
  static Files f = make("long", std::vector<uint64_t>(32, 256 * 1024));
  return f;
}
const Files& small_docs() {  // 64K documents of 64..256 tokens (~40 MiB)
  static Files f = [] {
    sb::Rng rng(2);
    std::vector<uint64_t> lengths(64 * 1024);
    for (auto& l : lengths) l = rng.range(64, 256);
    return make("small", lengths);
  }();
  return f;
}

// Which document to read next: sequential for long documents, uniform random for small ones.
uint64_t next_doc(const Files& f, bool random, sb::Rng& rng, uint64_t& i) {
  uint64_t n = f.offsets.size() - 1;
  return random ? rng.below(n) : (i++ % n);
}

void shard_reads(benchmark::State& state, const Files& f, bool random) {
  auto r = sb::ShardReader::open(f.shard);
  sb::Rng rng(3);
  uint64_t i = 0, bytes = 0;
  for (auto _ : state) {
    auto doc = r.read_doc(next_doc(f, random, rng, i));
    benchmark::DoNotOptimize(doc.data());
    bytes += 4 * doc.size();
  }
  state.SetBytesProcessed(int64_t(bytes));
  state.counters["docs/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}

void fread_reads(benchmark::State& state, const Files& f, bool random) {
  FILE* fp = std::fopen(f.raw.c_str(), "rb");
  sb::Rng rng(3);
  uint64_t i = 0, bytes = 0;
  std::vector<uint32_t> doc;
  for (auto _ : state) {
    uint64_t d = next_doc(f, random, rng, i), b = f.offsets[d], n = f.offsets[d + 1] - b;
    doc.resize(n);  // a fresh vector per read would be fairer still; the shard path returns one
    std::fseek(fp, long(4 * b), SEEK_SET);
    if (std::fread(doc.data(), 4, n, fp) != n) state.SkipWithError("short fread");
    benchmark::DoNotOptimize(doc.data());
    bytes += 4 * n;
  }
  std::fclose(fp);
  state.SetBytesProcessed(int64_t(bytes));
  state.counters["docs/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_ShardLongDocs(benchmark::State& s) { shard_reads(s, long_docs(), false); }
void BM_FreadLongDocs(benchmark::State& s) { fread_reads(s, long_docs(), false); }
void BM_ShardRandomSmallDocs(benchmark::State& s) { shard_reads(s, small_docs(), true); }
void BM_FreadRandomSmallDocs(benchmark::State& s) { fread_reads(s, small_docs(), true); }
BENCHMARK(BM_ShardLongDocs);
BENCHMARK(BM_FreadLongDocs);
BENCHMARK(BM_ShardRandomSmallDocs);
BENCHMARK(BM_FreadRandomSmallDocs);

// Removes the temporary files at exit.
struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("sb_bench_shard_" + std::to_string(::getpid())), ec);
  }
} cleanup;

}  // namespace

BENCHMARK_MAIN();
