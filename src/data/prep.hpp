// `sparsebalance prep`: text, llm.c token files or the synthetic generator -> token shards.
// The functions are the command's whole work, so tests call them directly as well.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/shard.hpp"
#include "src/data/records.hpp"
#include "src/data/synth.hpp"

namespace sb {

struct PrepStats {
  uint64_t documents = 0, tokens = 0, shards = 0;
  double seconds = 0;
  std::vector<std::string> files;
  std::string chat_template;  // prep text: the template "messages" records were rendered with ("" = none seen)
};

// Writes documents into DIR/shard_00000.h5, shard_00001.h5, ...; a shard is closed once the
// next document would take it past shard_tokens (whole documents only; an oversized document
// gets a shard of its own). The new shards are written into a staging directory inside DIR and
// moved into place by finish(): until the new set is complete (input read and valid, at least one
// document), DIR is untouched, and a failed prep leaves it as it was.
class ShardSetWriter {
 public:
  // Refuses a directory that already holds *.h5 files unless overwrite; with overwrite, finish()
  // replaces the old shards, and a *.h5 that is not a shard (attribute format) is refused up
  // front, never deleted. Stale shards of an earlier run never mix into a new dataset.
  ShardSetWriter(const std::string& dir, const ShardMeta& meta, uint64_t shard_tokens, bool overwrite);
  ~ShardSetWriter();  // without finish(): removes the staging directory, DIR stays as it was
  ShardSetWriter(const ShardSetWriter&) = delete;
  ShardSetWriter& operator=(const ShardSetWriter&) = delete;
  void add(std::span<const uint32_t> tokens, TaskSpan task = {}, std::span<const uint8_t> mask = {});
  PrepStats finish();  // closes the last shard, then replaces the old shards with the new ones

 private:
  std::string dir_, staging_;
  ShardMeta meta_;
  uint64_t shard_tokens_;
  std::unique_ptr<ShardWriter> cur_;
  PrepStats stats_;
  std::vector<std::string> old_;  // the shards finish() replaces
};

// An input file of prep: a regular file (not a directory, a FIFO or a device), named by --input.
void check_input_file(const std::string& path);

struct PrepOptions {
  std::string output;
  uint64_t shard_tokens = 1 << 24;
  bool overwrite = false;
  std::string tokenizer;       // prep text: a Hugging Face tokenizer.json (byte-level BPE); "" = bytes
  std::string eos;             // with tokenizer: the EOS token's text ("" = from the tokenizer's files)
  std::string chat_template = "auto";  // text, "messages" records: auto | chatml | llama3 | plain (chat_template.hpp)
  std::string chat_date;               // text: the date of a dated Llama system block ("26 Jul 2024"; "" = the template's)
  std::string mask = "none";  // synth: "none" (no /loss_mask) or "answers" (only the answer spans trained)
};

// format: "text" (split: "blank-lines" | "file") or "jsonl" (one JSON record per line: "text",
// "prompt" + "response" or "messages", src/data/records.hpp; the last two write /loss_mask).
// With opt.tokenizer the documents are BPE-encoded as Hugging Face would (bpe_tokenizer.hpp), else
// byte-tokenized; a record's pieces each on its own, except a chat rendered by the model's own
// template (opt.chat_template), whose ids are those of its whole text (apply_chat_template's).
PrepStats prep_text(const std::vector<std::string>& inputs, const std::string& format, const std::string& split,
                    const PrepOptions& opt);
// llm.c token files (header of 256 int32: magic 20240520, version 1, count; then uint16 tokens);
// documents separated by eot (not stored).
PrepStats prep_bin(const std::vector<std::string>& inputs, int64_t eot, int64_t vocab_size, const PrepOptions& opt);
PrepStats prep_synth(const SynthOptions& synth, const PrepOptions& opt);

// A record's ids and loss mask (one uint8 per id): each piece encoded on its own, or, for
// rec.whole, the ids of the whole text with the mask of the pieces' spans (a token that spans a
// boundary goes with the later piece). `encode` appends the ids of a text.
void encode_pieces(const Record& rec, const std::function<void(std::string_view, std::vector<uint32_t>&)>& encode,
                   std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask);

// The parts of a plain-text file between runs of blank (whitespace-only) lines; each part keeps
// its bytes exactly, without the newline that ends its last line.
std::vector<std::string> split_blank_lines(const std::string& text);

}  // namespace sb
