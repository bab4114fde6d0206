// Inside of BpeTokenizer (bpe_tokenizer.hpp), shared by its loader (bpe_load.cpp) and its
// encoder (bpe_tokenizer.cpp). Tables are open-addressing arrays over arenas, so neither
// loading 150k-280k merges nor the pre-token cache allocates per entry.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/data/bpe_tokenizer.hpp"

namespace sb {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ULL, h ^= h >> 29;
  }
  uint64_t w = 0;
  if (i < s.size()) std::memcpy(&w, s.data() + i, s.size() - i);
  return mix64(h ^ w);
}

// bytes -> a run of ids. Keys of up to 8 bytes and runs of up to 2 ids sit in the slot itself
// (most pre-tokens), so a hit reads one cache line; longer ones live in two arenas.
class BytesTable {
 public:
  struct Slot {
    uint64_t hash;
    uint64_t key;      // the key's bytes (zero-padded) when key_len <= 8, else its offset in keys_
    uint32_t key_len;  // kEmpty: a free slot
    uint32_t val_len;
    uint32_t val[2];   // the ids when val_len <= 2, else val[0] is their offset in vals_
  };
  static constexpr uint32_t kEmpty = UINT32_MAX;
  static uint64_t pack(std::string_view key) {  // key.size() <= 8
    uint64_t w = 0;
    if (!key.empty()) std::memcpy(&w, key.data(), key.size());
    return w;
  }
  const Slot* find(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return nullptr;
    const bool inline_key = key.size() <= 8;
    const uint64_t packed = inline_key ? pack(key) : 0;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key_len == kEmpty) return nullptr;
      if (s.hash != h || s.key_len != key.size()) continue;
      if (inline_key ? s.key == packed : std::memcmp(keys_.data() + s.key, key.data(), key.size()) == 0) return &s;
    }
  }
  std::span<const uint32_t> value(const Slot& s) const {
    return {s.val_len <= 2 ? s.val : vals_.data() + s.val[0], s.val_len};
  }
  void insert(std::string_view key, uint64_t h, std::span<const uint32_t> val) {  // key must be absent
    if (2 * (size_ + 1) > slots_.size()) grow();
    size_t i = h & mask_;
    while (slots_[i].key_len != kEmpty) i = (i + 1) & mask_;
    Slot& s = slots_[i];
    s = {h, 0, uint32_t(key.size()), uint32_t(val.size()), {0, 0}};
    if (key.size() <= 8) s.key = pack(key);
    else s.key = keys_.size(), keys_.append(key);
    if (val.size() <= 2) std::copy(val.begin(), val.end(), s.val);
    else s.val[0] = uint32_t(vals_.size()), vals_.insert(vals_.end(), val.begin(), val.end());
    ++size_;
  }
  size_t size() const { return size_; }
  size_t arena_bytes() const { return keys_.size() + 4 * vals_.size() + sizeof(Slot) * slots_.size(); }
  void clear() { slots_.clear(), keys_.clear(), vals_.clear(), size_ = 0, mask_ = 0; }

 private:
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 1024 : 2 * old.size(), Slot{0, 0, kEmpty, 0, {0, 0}});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.key_len == kEmpty) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].key_len != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<uint32_t> vals_;
  size_t size_ = 0, mask_ = 0;
};

// (left id, right id) -> (rank << 32 | merged id); fixed size, filled once at load.
class PairTable {
 public:
  static constexpr uint64_t kNone = UINT64_MAX;
  static uint64_t key(uint32_t a, uint32_t b) { return uint64_t(a) << 32 | b; }
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    keys_.assign(cap, kNone), vals_.assign(cap, kNone), mask_ = cap - 1;
  }
  // A pair already there takes the new value (HF's merge map keeps the last of repeated pairs).
  void insert(uint64_t k, uint64_t v) {
    size_t i = mix64(k) & mask_;
    while (keys_[i] != k && keys_[i] != kNone) i = (i + 1) & mask_;
    keys_[i] = k, vals_[i] = v;
  }
  uint64_t find(uint64_t k) const {
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == k) return vals_[i];
      if (keys_[i] == kNone) return kNone;
    }
  }

 private:
  std::vector<uint64_t> keys_, vals_;
  size_t mask_ = 0;
};

inline constexpr uint32_t kNoByteToken = UINT32_MAX;

struct AddedToken {
  std::string text;  // UTF-8 as written in the file
  uint32_t id = 0;
};

// Added tokens matched in one stage (raw text, or after the normalizer): leftmost-longest.
struct AddedSet {
  std::vector<AddedToken> tokens;          // longest first, so the first hit at a position wins
  std::array<bool, 256> first_byte{};      // quick skip of bytes no token starts with
  bool empty() const { return tokens.empty(); }
};

struct BpeTokenizer::Impl {
  std::string path, name, sha256, config_eos;  // config_eos: tokenizer_config.json's eos_token
  std::vector<std::string> id_bytes;           // decode table; added tokens give their text
  std::vector<uint8_t> id_used;
  BytesTable vocab;                            // byte-level tokens: bytes -> id
  std::array<uint32_t, 256> byte_id{};
  PairTable merges;
  size_t num_merges = 0;
  bool ignore_merges = false;
  const icu::Normalizer2* nfc = nullptr;    // the NFC normalizer, or none
  AddedSet added_raw, added_norm;              // normalized=false tokens / normalized=true ones
  std::vector<pcre2_code*> splits;             // Split pre-tokenizers, in order
  bool prefix_space = false;                   // ByteLevel.add_prefix_space
  pcre2_code* byte_level_regex = nullptr;      // ByteLevel.use_regex: the GPT-2 pattern
  pcre2_match_data* match = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  BytesTable cache;                            // pre-token bytes -> ids
  size_t heap_threshold = 64;
  std::string norm_buf, prefix_buf;            // scratch, reused across calls
  std::vector<uint64_t> pair_buf;
  std::vector<uint32_t> sym_buf;

  ~Impl();
  std::optional<uint32_t> find_token(std::string_view bytes) const {
    const auto* s = vocab.find(bytes, hash_bytes(bytes));
    return s ? std::optional<uint32_t>(vocab.value(*s)[0]) : std::nullopt;
  }
  pcre2_code* compile(const std::string& pattern, const std::string& field);
  void encode_segment(std::string_view text, std::vector<uint32_t>& out);
  void split_stage(std::string_view text, size_t stage, std::vector<uint32_t>& out);
  void byte_level(std::string_view piece, std::vector<uint32_t>& out);
  void bpe(std::string_view piece, std::vector<uint32_t>& out);
  uint32_t byte_token(uint8_t b) const;
  void merge_linear(std::vector<uint32_t>& out);
  void merge_heap(std::vector<uint32_t>& out);
};

// The GPT-2 byte <-> unicode alphabet: printable Latin-1 bytes stand for themselves, the other
// 68 bytes for U+0100.. in order.
std::array<uint32_t, 256> byte_to_codepoint();

}  // namespace sb
