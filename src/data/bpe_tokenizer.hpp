// Byte-level BPE from a Hugging Face tokenizer.json, as GPT-2, Llama 3 and Qwen2/2.5/3 use it.
// encode() gives the ids of `tokenizers`' encode(text, add_special_tokens=False):
//   1. added tokens (special or not) found in the raw text become their ids (leftmost-longest);
//   2. the normalizer of the rest (none or NFC, ICU);
//   3. the pre-tokenizer: Split regexes (Isolated; PCRE2 with UTF+UCP, JIT), then ByteLevel
//      (optional prefix space, optional GPT-2 regex; bytes stand for themselves);
//   4. BPE merges of each pre-token, done on bytes (vocab and merges are mapped back from the
//      GPT-2 byte<->unicode alphabet at load), with ignore_merges as the file says.
// Anything else in the file (another model type, normalizer, pre-tokenizer, decoder, an added
// token with lstrip/rstrip/single_word, BPE dropout, ...) is refused at load, naming the file and
// the field. truncation and padding are ignored: documents are stored whole.
// Not thread-safe: encode() keeps a cache of pre-token results; use one tokenizer per thread.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sb {

class BpeTokenizer {
 public:
  // Reads and checks PATH; the name is tokenizer_config.json's "name_or_path" beside it if
  // present, else the name of the folder holding PATH.
  static BpeTokenizer load(const std::string& path);
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Appends the ids of `text` (valid UTF-8, else an error naming the byte offset) to `out`.
  void encode(std::string_view text, std::vector<uint32_t>& out);
  std::vector<uint32_t> encode(std::string_view text);
  // Ids -> bytes (added tokens give their text); ids >= vocab_size are an error.
  std::string decode(std::span<const uint32_t> ids) const;

  const std::string& path() const;
  const std::string& name() const;
  const std::string& sha256() const;   // of the file's bytes, lowercase hex (as sha256sum prints)
  int64_t vocab_size() const;          // largest id + 1, added tokens included
  size_t num_merges() const;
  // The id of an added token's text, or of a vocab token given as its bytes.
  std::optional<uint32_t> token_id(std::string_view text) const;
  // EOS: `eos` if given (a token's text), else tokenizer_config.json's eos_token beside the file,
  // else the first of <|endoftext|>, <|end_of_text|>, </s> that exists; an error otherwise.
  uint32_t eos_id(const std::string& eos = "") const;
  // What shards record as their `tokenizer` attribute: "NAME sha256:HEX".
  std::string shard_name() const;

  // Splits above this many bytes use the heap merge loop; shorter ones a linear scan (tests
  // lower it to check that both give the same ids).
  void set_heap_threshold(size_t bytes);
  void clear_cache();  // the pre-token cache (benchmarks time a cold start with it)

  struct Impl;

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The hash that shard_name() carries: "NAME sha256:HEX" -> "HEX" ("" when there is none).
std::string shard_tokenizer_sha256(const std::string& shard_tokenizer);
std::string sha256_hex(std::string_view bytes);

}  // namespace sb
