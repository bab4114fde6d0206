// Byte-level tokenizer: ids 0..255 are the bytes, then three specials. Shards store a document's
// bytes only (no BOS/EOS inside), so any text, valid UTF-8 or not, round-trips exactly.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sb {

struct ByteTokenizer {
  static constexpr uint32_t kBos = 256, kEos = 257, kPad = 258;
  static constexpr int64_t kVocabSize = 259;
  static constexpr const char* kName = "byte";

  static std::vector<uint32_t> encode(std::string_view text);
  // Bytes back; specials (BOS/EOS/PAD) are dropped, other ids >= 256 are an error.
  static std::string decode(std::span<const uint32_t> ids);
};

}  // namespace sb
