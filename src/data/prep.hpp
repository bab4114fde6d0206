// `sparsebalance prep`: text, llm.c token files or the synthetic generator -> token shards.
// The functions are the command's whole work, so tests call them directly as well.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/shard.hpp"
#include "src/data/synth.hpp"

namespace sb {

struct PrepStats {
  uint64_t documents = 0, tokens = 0, shards = 0;
  double seconds = 0;
  std::vector<std::string> files;
};

// Writes documents into DIR/shard_00000.h5, shard_00001.h5, ...; a shard is closed once the
// next document would take it past shard_tokens (whole documents only; an oversized document
// gets a shard of its own).
class ShardSetWriter {
 public:
  // Refuses a directory that already holds *.h5 files unless overwrite (then removes them), so
  // stale shards of an earlier run never mix into a new dataset.
  ShardSetWriter(const std::string& dir, const ShardMeta& meta, uint64_t shard_tokens, bool overwrite);
  void add(std::span<const uint32_t> tokens, TaskSpan task = {}, std::span<const uint8_t> mask = {});
  PrepStats finish();  // closes the last shard

 private:
  std::string dir_;
  ShardMeta meta_;
  uint64_t shard_tokens_;
  std::unique_ptr<ShardWriter> cur_;
  PrepStats stats_;
};

struct PrepOptions {
  std::string output;
  uint64_t shard_tokens = 1 << 24;
  bool overwrite = false;
  std::string mask = "none";  // synth: "none" (no /loss_mask) or "answers" (only the answer spans trained)
};

// format: "text" (split: "blank-lines" | "file") or "jsonl" (one JSON record per line: "text",
// "prompt" + "response" or "messages", src/data/records.hpp; the last two write /loss_mask).
PrepStats prep_text(const std::vector<std::string>& inputs, const std::string& format, const std::string& split,
                    const PrepOptions& opt);
// llm.c token files (header of 256 int32: magic 20240520, version 1, count; then uint16 tokens);
// documents separated by eot (not stored).
PrepStats prep_bin(const std::vector<std::string>& inputs, int64_t eot, int64_t vocab_size, const PrepOptions& opt);
PrepStats prep_synth(const SynthOptions& synth, const PrepOptions& opt);

// The parts of a plain-text file between runs of blank (whitespace-only) lines; each part keeps
// its bytes exactly, without the newline that ends its last line.
std::vector<std::string> split_blank_lines(const std::string& text);

}  // namespace sb
