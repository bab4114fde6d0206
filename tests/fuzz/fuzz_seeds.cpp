// Writes small, valid seed inputs for the fuzz targets: shards (with and without task data, one
// streamed by ShardWriter) and checkpoints (a few tensors, with a /latency-like extra group).
// Usage: fuzz_seeds OUTDIR   -> OUTDIR/shard/*.h5, OUTDIR/checkpoint/*.h5, OUTDIR/config/*.toml
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/file_checksum.hpp"
#include "io/h5.hpp"
#include "io/shard.hpp"
#include "src/config/config.hpp"

namespace fs = std::filesystem;

static void write_small_shard(const std::string& path, bool tasks, int docs) {
  sb::h5::Id f = sb::h5::create(path);
  sb::h5::write_attr(f, "format", std::string(sb::kShardFormat));
  sb::h5::write_attr(f, "version", sb::kShardVersion);
  sb::h5::write_attr(f, "vocab_size", int64_t(64));
  sb::h5::write_attr(f, "tokenizer", std::string("byte"));
  sb::h5::write_attr(f, "eos_id", int64_t(0));
  std::vector<uint32_t> tok;
  std::vector<uint64_t> off{0};
  std::vector<uint8_t> type;
  std::vector<uint64_t> spans;
  for (int d = 0; d < docs; ++d) {
    for (int i = 0; i < 5 + 3 * d; ++i) tok.push_back(uint32_t((i * 7 + d) % 64));
    off.push_back(tok.size());
    type.push_back(uint8_t(d % 4));
    spans.push_back(1), spans.push_back(3);
  }
  sb::h5::write_vector(f, "tokens", tok);
  sb::h5::write_vector(f, "doc_offsets", off);
  if (tasks) {
    sb::h5::write_vector(f, "task_type", type);
    sb::h5::write_vector(f, "answer_spans", spans, {hsize_t(docs), 2});
  }
}

static void small_shard(const std::string& path, bool tasks, int docs) {
  write_small_shard(path, tasks, docs);
  sb::stamp_file_checksum(path);  // as every writer of the program does (io/file_checksum.hpp)
}

static void small_checkpoint(const std::string& path, bool extra) {
  sb::Checkpoint ck;
  ck.step = 3, ck.ranks = 2, ck.data_epoch = 0, ck.data_cursor = 17, ck.skipped_steps = 0;
  ck.config_toml = "[train]\nsteps = 4\n";
  size_t off = 0;
  for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"model.embed_tokens.weight", {4, 3}}, {"model.norm.weight", {3}}, {"lm_head.weight", {2, 3}}}) {
    size_t n = 1;
    for (auto s : shape) n *= size_t(s);
    ck.tensors.push_back({name, shape, off, n});
    off += n;
  }
  for (size_t i = 0; i < off; ++i) ck.params.push_back(0.1f * float(i)), ck.m.push_back(0.01f), ck.v.push_back(0.001f);
  sb::write_checkpoint(path, ck, [&](hid_t f) {
    if (!extra) return;
    sb::h5::Id g = sb::h5::group(f, "latency", true);
    sb::h5::write_attr(g, "device", std::string("cpu"));
    sb::h5::write_vector(f, "recall/alpha", std::vector<double>{0.5, 0.5});
  });
}

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: fuzz_seeds OUTDIR\n"), 2;
  const std::string out = argv[1];
  for (const char* d : {"shard", "checkpoint", "config"}) fs::create_directories(out + "/" + d);
  small_shard(out + "/shard/plain.h5", false, 3);
  small_shard(out + "/shard/tasks.h5", true, 4);
  small_shard(out + "/shard/one.h5", false, 1);
  {
    sb::ShardWriter w(out + "/shard/streamed.h5", sb::ShardMeta{64, "byte", 0});
    std::vector<uint32_t> doc{1, 2, 3, 4, 5, 6, 7};
    w.add(doc);
    w.add(doc, sb::TaskSpan{1, 2, 4});
    w.close();
  }
  small_checkpoint(out + "/checkpoint/plain.h5", false);
  small_checkpoint(out + "/checkpoint/extra.h5", true);
  std::ofstream(out + "/config/defaults.toml") << sb::Config().to_toml();
  std::ofstream(out + "/config/small.toml")
      << "[model]\nd_model = 32\nn_heads = 4\n[train]\nsteps = 3\nlr = 1e-3\nnonfinite = \"stop\"\n"
         "\n--set\ntrain.steps=7\nattention.mode=dense\nmodel.tie_embeddings=false\n";
  return 0;
}
