#include "src/data/tokenizer.hpp"

#include "base/error.hpp"

namespace sb {

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> ids) {
  std::string out;
  out.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id < 256) out.push_back(static_cast<char>(id));
    else if (id >= kVocabSize) throw Error("byte tokenizer: id " + std::to_string(id) + " is not < vocab_size 259");
  }
  return out;
}

}  // namespace sb
