// Byte-level BPE encode/decode (bpe_tokenizer.hpp); loading is in bpe_load.cpp.
#include <algorithm>
#include <queue>

#include <unicode/bytestream.h>
#include <unicode/stringpiece.h>

#include "base/error.hpp"
#include "src/data/bpe_impl.hpp"

namespace sb {

namespace {

// Offset of the first byte that is not valid UTF-8 (overlong, surrogate, > U+10FFFF,
// truncated), or npos.
size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    unsigned c = p[i];
    size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (len == 0 || c > 0xf4 || i + len > n) return i;
    for (size_t k = 1; k < len; ++k)
      if ((p[i + k] & 0xc0) != 0x80) return i;
    if (len == 3 && ((c == 0xe0 && p[i + 1] < 0xa0) || (c == 0xed && p[i + 1] >= 0xa0))) return i;
    if (len == 4 && ((c == 0xf0 && p[i + 1] < 0x90) || (c == 0xf4 && p[i + 1] >= 0x90))) return i;
    i += len;
  }
  return std::string_view::npos;
}

size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2; }

// Calls piece(text) for the parts of s between added tokens and pushes the tokens' ids.
template <class F>
void split_added(const AddedSet& set, std::string_view s, std::vector<uint32_t>& out, F&& piece) {
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!set.first_byte[uint8_t(s[i])]) continue;
    const AddedToken* hit = nullptr;
    for (const auto& tok : set.tokens)  // longest first
      if (tok.text.size() <= s.size() - i && std::memcmp(s.data() + i, tok.text.data(), tok.text.size()) == 0) {
        hit = &tok;
        break;
      }
    if (!hit) continue;
    if (i > start) piece(s.substr(start, i - start));
    out.push_back(hit->id);
    start = i + hit->text.size(), i = start - 1;
  }
  if (start < s.size()) piece(s.substr(start));
}

// Isolated split: every match and every gap between matches is a piece, in order.
template <class F>
void split_regex(const BpeTokenizer::Impl& t, pcre2_code* re, std::string_view s, F&& piece) {
  size_t pos = 0, last = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  while (pos < s.size()) {
    int rc = pcre2_match(re, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, t.match, t.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(t.path + ": pre_tokenizer regex failed on a piece of " + std::to_string(s.size()) +
                  " bytes: " + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(t.match);
    size_t b = ov[0], e = ov[1];
    if (e == b) {  // an empty match carries no piece; look again one character on
      pos = b + utf8_len(uint8_t(s[b]));
      continue;
    }
    if (b > last) piece(s.substr(last, b - last));
    piece(s.substr(b, e - b));
    last = pos = e;
  }
  if (last < s.size()) piece(s.substr(last));
}

// Whitespace as Oniguruma (HF's regex engine) means it: \p{Z} and \t\n\v\f\r, U+0085. PCRE2's
// own \s would add U+180E.
constexpr const char* kSpaceClass = R"(\t\n\x0B\f\r\x{85}\p{Z})";

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[++i];
      if (n == 's') out += in_class ? std::string(kSpaceClass) : "[" + std::string(kSpaceClass) + "]";
      else if (n == 'S' && !in_class) out += "[^" + std::string(kSpaceClass) + "]";
      else out += c, out += n;
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] inside a class
      size_t end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i, end + 2 - i), i = end + 1;
        continue;
      }
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ] first in the class
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

}  // namespace

pcre2_code* BpeTokenizer::Impl::compile(const std::string& pattern, const std::string& field) {
  int err = 0;
  PCRE2_SIZE at = 0;
  std::string pcre = onig_to_pcre2(pattern);
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(), PCRE2_UTF | PCRE2_UCP, &err,
                                 &at, nullptr);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(path + ": " + field + ": regex does not compile (" + reinterpret_cast<const char*>(msg) + " at offset " +
                std::to_string(at) + " of " + pcre + ")");
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // without JIT (not built in) pcre2_match interprets
  if (!match) match = pcre2_match_data_create(1, nullptr);
  if (!mctx) {
    // Whitespace runs backtrack through (?!\S): a JIT stack of up to 64 MiB keeps long runs working.
    mctx = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
  }
  return re;
}

BpeTokenizer::Impl::~Impl() {
  for (auto* re : splits) pcre2_code_free(re);
  pcre2_code_free(byte_level_regex);
  pcre2_match_data_free(match);
  pcre2_match_context_free(mctx);
  if (jit_stack) pcre2_jit_stack_free(jit_stack);
}

void BpeTokenizer::Impl::encode_segment(std::string_view text, std::vector<uint32_t>& out) {
  if (nfc) {
    UErrorCode err = U_ZERO_ERROR;
    icu::StringPiece sp(text.data(), int32_t(text.size()));
    if (!nfc->isNormalizedUTF8(sp, err) || U_FAILURE(err)) {
      err = U_ZERO_ERROR;
      std::string normalized;
      icu::StringByteSink<std::string> sink(&normalized, int32_t(text.size()));
      nfc->normalizeUTF8(0, sp, sink, nullptr, err);
      if (U_FAILURE(err)) throw Error(path + ": normalizer: NFC failed (" + u_errorName(err) + ")");
      norm_buf.swap(normalized);
      text = norm_buf;
    }
  }
  split_added(added_norm, text, out, [&](std::string_view s) { split_stage(s, 0, out); });
}

void BpeTokenizer::Impl::split_stage(std::string_view text, size_t stage, std::vector<uint32_t>& out) {
  if (stage == splits.size()) return byte_level(text, out);
  split_regex(*this, splits[stage], text, [&](std::string_view s) { split_stage(s, stage + 1, out); });
}

void BpeTokenizer::Impl::byte_level(std::string_view piece, std::vector<uint32_t>& out) {
  if (prefix_space && piece[0] != ' ') {
    prefix_buf.assign(1, ' ');
    prefix_buf.append(piece);
    piece = prefix_buf;
  }
  if (!byte_level_regex) return bpe(piece, out);
  split_regex(*this, byte_level_regex, piece, [&](std::string_view s) { bpe(s, out); });
}

uint32_t BpeTokenizer::Impl::byte_token(uint8_t b) const {
  if (byte_id[b] == kNoByteToken)
    throw Error(path + ": model.vocab: no token for byte " + std::to_string(b) + ", which the text holds");
  return byte_id[b];
}

void BpeTokenizer::Impl::bpe(std::string_view piece, std::vector<uint32_t>& out) {
  if (piece.size() == 1) return out.push_back(byte_token(uint8_t(piece[0])));
  uint64_t h = hash_bytes(piece);
  if (const auto* hit = cache.find(piece, h)) {
    auto ids = cache.value(*hit);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  size_t first = out.size();
  const BytesTable::Slot* whole = ignore_merges ? vocab.find(piece, h) : nullptr;
  if (whole) {
    out.push_back(vocab.value(*whole)[0]);
  } else {
    sym_buf.resize(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) sym_buf[i] = byte_token(uint8_t(piece[i]));
    if (piece.size() <= heap_threshold) merge_linear(out);
    else merge_heap(out);
  }
  if (piece.size() <= 1024) {  // longer pieces are rare and would crowd the cache
    if (cache.size() >= (1u << 20) || cache.arena_bytes() >= (256u << 20)) cache.clear();
    cache.insert(piece, h, {out.data() + first, out.size() - first});
  }
}

// Repeatedly merges the pair of lowest rank (leftmost among equals): a scan per merge, which
// for the short pieces of ordinary text beats a heap.
void BpeTokenizer::Impl::merge_linear(std::vector<uint32_t>& out) {
  auto& s = sym_buf;
  auto& p = pair_buf;  // p[i]: (rank << 32 | merged id) of s[i], s[i+1]
  p.resize(s.size() - 1);
  for (size_t i = 0; i + 1 < s.size(); ++i) p[i] = merges.find(PairTable::key(s[i], s[i + 1]));
  while (!p.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < p.size(); ++i)
      if (p[i] < p[best]) best = i;
    if (p[best] == PairTable::kNone) break;
    s[best] = uint32_t(p[best]);
    s.erase(s.begin() + ptrdiff_t(best) + 1);
    p.erase(p.begin() + ptrdiff_t(best));
    if (best > 0) p[best - 1] = merges.find(PairTable::key(s[best - 1], s[best]));
    if (best < p.size()) p[best] = merges.find(PairTable::key(s[best], s[best + 1]));
  }
  out.insert(out.end(), s.begin(), s.end());
}

// The same merges with a heap of (rank, position) and a linked list: O(n log n) for long pieces
// (a run of 100k '=' is one pre-token).
void BpeTokenizer::Impl::merge_heap(std::vector<uint32_t>& out) {
  const size_t n = sym_buf.size();
  std::vector<int64_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) prev[i] = int64_t(i) - 1, next[i] = i + 1 < n ? int64_t(i) + 1 : -1;
  struct Item { uint64_t rank_pos; uint32_t id; };
  auto later = [](const Item& a, const Item& b) { return a.rank_pos > b.rank_pos; };
  std::priority_queue<Item, std::vector<Item>, decltype(later)> heap(later);
  auto push = [&](int64_t pos) {
    if (pos < 0 || next[size_t(pos)] < 0) return;
    uint64_t v = merges.find(PairTable::key(sym_buf[size_t(pos)], sym_buf[size_t(next[size_t(pos)])]));
    if (v != PairTable::kNone) heap.push({(v >> 32) << 32 | uint64_t(pos), uint32_t(v)});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int64_t(i));
  while (!heap.empty()) {
    Item top = heap.top();
    heap.pop();
    size_t pos = size_t(top.rank_pos & 0xffffffffu);
    if (!alive[pos] || next[pos] < 0) continue;
    size_t r = size_t(next[pos]);
    uint64_t v = merges.find(PairTable::key(sym_buf[pos], sym_buf[r]));
    if (v == PairTable::kNone || (v >> 32) != (top.rank_pos >> 32) || uint32_t(v) != top.id) continue;  // stale
    sym_buf[pos] = top.id, alive[r] = 0, next[pos] = next[r];
    if (next[r] >= 0) prev[size_t(next[r])] = int64_t(pos);
    push(prev[pos]);
    push(int64_t(pos));
  }
  for (int64_t i = 0; i >= 0; i = next[size_t(i)]) out.push_back(sym_buf[size_t(i)]);
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) {
  if (size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
    throw Error("tokenizer " + impl_->path + ": the text is not valid UTF-8 at byte " + std::to_string(bad));
  Impl& t = *impl_;
  split_added(t.added_raw, text, out, [&](std::string_view s) { t.encode_segment(s, out); });
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  encode(text, ids);
  return ids;
}

std::string BpeTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  for (uint32_t id : ids) {
    if (id >= impl_->id_bytes.size() || !impl_->id_used[id])
      throw Error("tokenizer " + impl_->path + ": id " + std::to_string(id) + " is not a token (vocab_size " +
                  std::to_string(vocab_size()) + ")");
    out += impl_->id_bytes[id];
  }
  return out;
}

const std::string& BpeTokenizer::path() const { return impl_->path; }
const std::string& BpeTokenizer::name() const { return impl_->name; }
const std::string& BpeTokenizer::sha256() const { return impl_->sha256; }
int64_t BpeTokenizer::vocab_size() const { return int64_t(impl_->id_bytes.size()); }
size_t BpeTokenizer::num_merges() const { return impl_->num_merges; }
void BpeTokenizer::set_heap_threshold(size_t bytes) { impl_->heap_threshold = bytes, impl_->cache.clear(); }
void BpeTokenizer::clear_cache() { impl_->cache.clear(); }
std::string BpeTokenizer::shard_name() const { return impl_->name + " sha256:" + impl_->sha256; }

std::optional<uint32_t> BpeTokenizer::token_id(std::string_view text) const {
  for (const AddedSet* set : {&impl_->added_raw, &impl_->added_norm})
    for (const auto& tok : set->tokens)
      if (tok.text == text) return tok.id;
  return impl_->find_token(text);
}

uint32_t BpeTokenizer::eos_id(const std::string& eos) const {
  if (!eos.empty()) {
    if (auto id = token_id(eos)) return *id;
    throw Error("--eos " + eos + ": not a token of " + impl_->path);
  }
  std::vector<std::string> names = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
  if (!impl_->config_eos.empty()) names.insert(names.begin(), impl_->config_eos);
  for (const auto& n : names)
    if (auto id = token_id(n)) return *id;
  throw Error(impl_->path + ": no EOS token (tokenizer_config.json eos_token, <|endoftext|>, <|end_of_text|>, </s>); "
              "name one with --eos TOKEN (prep.eos)");
}

std::string shard_tokenizer_sha256(const std::string& shard_tokenizer) {
  size_t at = shard_tokenizer.rfind(" sha256:");
  return at == std::string::npos ? "" : shard_tokenizer.substr(at + 8);
}

}  // namespace sb
