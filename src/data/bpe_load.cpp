// Loading a tokenizer.json into BpeTokenizer::Impl (bpe_impl.hpp): a SAX pass that builds a
// small JSON tree of everything except model.vocab and model.merges (150k-280k entries, taken
// straight into flat arrays), then the checks that refuse what encode() does not implement.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/input_file.hpp"
#include "io/shard.hpp"
#include "src/data/bpe_impl.hpp"

namespace sb {

namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& path, const std::string& field, const std::string& what) {
  throw Error(path + ": " + field + ": " + what);
}

// Everything but model.vocab / model.merges as a json tree; those two into vectors.
struct Sax : nlohmann::json_sax<json> {
  json root;
  std::vector<json*> stack;
  std::string key_;
  json* model = nullptr;
  enum Mode { kDom, kVocab, kMerges, kPair } mode = kDom;
  Mode pending = kDom;
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, uint64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> pair;
  std::string error;  // first structural problem (the SAX run stops there)

  bool fail(std::string e) { return error = std::move(e), false; }
  json* add(json v) {
    if (stack.empty()) return root = std::move(v), &root;
    json* top = stack.back();
    if (top->is_object()) return &((*top)[key_] = std::move(v));
    top->push_back(std::move(v));
    return &top->back();
  }
  bool merge_string(std::string& s) {
    size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      return fail("model.merges[" + std::to_string(merges.size()) + "]: \"" + s + "\" is not \"left right\"");
    merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    return true;
  }
  bool scalar(json v, const char* what) {
    if (pending != kDom) return fail(std::string(pending == kVocab ? "model.vocab" : "model.merges") + ": expected " +
                                     (pending == kVocab ? "an object" : "an array") + ", got " + what);
    if (mode == kVocab) return fail("model.vocab[\"" + key_ + "\"]: expected an integer id, got " + what);
    if (mode != kDom) return fail("model.merges[" + std::to_string(merges.size()) + "]: expected \"a b\" or [\"a\", \"b\"], got " + what);
    add(std::move(v));
    return true;
  }
  bool null() override { return scalar(nullptr, "null"); }
  bool boolean(bool b) override { return scalar(b, "a boolean"); }
  bool number_integer(int64_t v) override {
    if (mode == kVocab && v >= 0) return number_unsigned(uint64_t(v));
    return scalar(v, "a negative number");
  }
  bool number_unsigned(uint64_t v) override {
    if (mode != kVocab) return scalar(v, "a number");
    vocab.emplace_back(std::move(key_), v);
    return true;
  }
  bool number_float(double v, const std::string&) override { return scalar(v, "a number"); }
  bool string(std::string& s) override {
    if (mode == kMerges) return merge_string(s);
    if (mode == kPair) return pair.push_back(std::move(s)), true;
    return scalar(std::move(s), "a string");
  }
  bool binary(json::binary_t&) override { return fail("binary value"); }
  bool start_object(size_t) override {
    if (pending == kVocab) return mode = kVocab, pending = kDom, has_vocab = true;
    if (mode != kDom || pending != kDom) return scalar(nullptr, "an object");
    json* node = add(json::object());
    if (stack.size() == 1 && key_ == "model") model = node;
    stack.push_back(node);
    return true;
  }
  bool key(std::string& k) override {
    if (mode == kVocab) return key_ = std::move(k), true;
    if (!stack.empty() && stack.back() == model && (k == "vocab" || k == "merges"))
      pending = k == "vocab" ? kVocab : kMerges;
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode == kVocab) return mode = kDom, true;
    stack.pop_back();
    return true;
  }
  bool start_array(size_t) override {
    if (pending == kMerges) return mode = kMerges, pending = kDom, has_merges = true;
    if (mode == kMerges) return mode = kPair, pair.clear(), true;
    if (mode != kDom || pending != kDom) return scalar(nullptr, "an array");
    stack.push_back(add(json::array()));
    return true;
  }
  bool end_array() override {
    if (mode == kPair) {
      if (pair.size() != 2)
        return fail("model.merges[" + std::to_string(merges.size()) + "]: expected a pair [\"a\", \"b\"], got " +
                    std::to_string(pair.size()) + " strings");
      merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
      return mode = kMerges, true;
    }
    if (mode == kMerges) return mode = kDom, true;
    stack.pop_back();
    return true;
  }
  bool parse_error(size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    return fail("JSON: invalid JSON at byte " + std::to_string(pos) + " (" + e.what() + ")");
  }
};

std::string read_all(const std::string& path, const char* what) {
  return read_input_file(path, what, kMaxTextInputBytes);  // the input-file rule
}

// UTF-8 text of GPT-2 byte-level characters -> the bytes they stand for; nullopt if a character
// is outside the alphabet.
struct ByteLevelAlphabet {
  std::array<int16_t, 512> byte_of;  // code point -> byte, -1 outside
  ByteLevelAlphabet() {
    byte_of.fill(-1);
    auto cps = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) byte_of[cps[size_t(b)]] = int16_t(b);
  }
  std::optional<std::string> bytes(std::string_view s) const {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      auto c = static_cast<unsigned char>(s[i]);
      uint32_t cp;
      if (c < 0x80) cp = c, i += 1;
      else if ((c >> 5) == 6 && i + 1 < s.size()) cp = (c & 0x1fu) << 6 | (uint8_t(s[i + 1]) & 0x3fu), i += 2;
      else return std::nullopt;  // 3- and 4-byte characters are never in the alphabet
      if (cp >= byte_of.size() || byte_of[cp] < 0) return std::nullopt;
      out.push_back(char(byte_of[cp]));
    }
    return out;
  }
};

const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

bool flag(const json& j, const char* name, bool dflt, const std::string& path, const std::string& where) {
  const json* v = field(j, name);
  if (!v) return dflt;
  if (!v->is_boolean()) refuse(path, where + "." + name, "expected true or false");
  return v->get<bool>();
}

std::string type_of(const json& j, const std::string& path, const std::string& where) {
  const json* t = j.is_object() ? field(j, "type") : nullptr;
  if (!t || !t->is_string()) refuse(path, where + ".type", "expected an object with a string \"type\"");
  return t->get<std::string>();
}

void load_normalizer(BpeTokenizer::Impl& t, const json& root) {
  const json* n = field(root, "normalizer");
  if (!n) return;
  std::vector<std::pair<const json*, std::string>> items{{n, "normalizer"}};
  if (type_of(*n, t.path, "normalizer") == "Sequence") {
    items.clear();
    const json* list = field(*n, "normalizers");
    if (!list || !list->is_array()) refuse(t.path, "normalizer.normalizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) items.push_back({&(*list)[i], "normalizer.normalizers[" + std::to_string(i) + "]"});
  }
  for (const auto& [item, where] : items) {
    std::string type = type_of(*item, t.path, where);
    if (type != "NFC") refuse(t.path, where + ".type", "\"" + type + "\" is not implemented (null or NFC only)");
    UErrorCode err = U_ZERO_ERROR;
    t.nfc = icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err)) refuse(t.path, where, std::string("ICU has no NFC normalizer: ") + u_errorName(err));
  }
}

// The GPT-2 pattern ByteLevel applies itself when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void load_pre_tokenizer(BpeTokenizer::Impl& t, const json& root) {
  const json* p = field(root, "pre_tokenizer");
  if (!p) refuse(t.path, "pre_tokenizer", "null: a byte-level BPE needs ByteLevel (alone or last in a Sequence)");
  std::vector<std::pair<const json*, std::string>> items{{p, "pre_tokenizer"}};
  if (type_of(*p, t.path, "pre_tokenizer") == "Sequence") {
    items.clear();
    const json* list = field(*p, "pretokenizers");
    if (!list || !list->is_array()) refuse(t.path, "pre_tokenizer.pretokenizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      items.push_back({&(*list)[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]"});
  }
  bool byte_level = false;
  for (const auto& [item, where] : items) {
    std::string type = type_of(*item, t.path, where);
    if (byte_level) refuse(t.path, where + ".type", "\"" + type + "\" after ByteLevel is not implemented (ByteLevel must be last)");
    if (type == "ByteLevel") {
      byte_level = true;
      t.prefix_space = flag(*item, "add_prefix_space", true, t.path, where);
      if (flag(*item, "use_regex", true, t.path, where)) t.byte_level_regex = t.compile(kGpt2Pattern, where + ".use_regex");
    } else if (type == "Split") {
      const json* behavior = field(*item, "behavior");
      if (!behavior || *behavior != "Isolated")
        refuse(t.path, where + ".behavior", (behavior ? behavior->dump() : "missing") + " is not implemented (Isolated only)");
      if (flag(*item, "invert", false, t.path, where)) refuse(t.path, where + ".invert", "true is not implemented");
      const json* pat = field(*item, "pattern");
      const json* re = pat && pat->is_object() ? field(*pat, "Regex") : nullptr;
      const json* lit = pat && pat->is_object() ? field(*pat, "String") : nullptr;
      if (re && re->is_string()) t.splits.push_back(t.compile(re->get<std::string>(), where + ".pattern.Regex"));
      else if (lit && lit->is_string()) t.splits.push_back(t.compile("\\Q" + lit->get<std::string>() + "\\E", where + ".pattern.String"));
      else refuse(t.path, where + ".pattern", "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    } else {
      refuse(t.path, where + ".type", "\"" + type + "\" is not implemented (ByteLevel, Split or a Sequence of them)");
    }
  }
  if (!byte_level) refuse(t.path, "pre_tokenizer", "no ByteLevel pre-tokenizer: not a byte-level BPE");
}

void load_model_options(BpeTokenizer::Impl& t, const json& m) {
  const json* type = field(m, "type");
  if (type && *type != "BPE") refuse(t.path, "model.type", type->dump() + " is not implemented (BPE only)");
  if (const json* d = field(m, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    refuse(t.path, "model.dropout", d->dump() + ": BPE dropout is not implemented (null only)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = field(m, k); v && *v != "") refuse(t.path, std::string("model.") + k, v->dump() + " is not implemented (null or \"\")");
  if (flag(m, "byte_fallback", false, t.path, "model")) refuse(t.path, "model.byte_fallback", "true is not implemented");
  t.ignore_merges = flag(m, "ignore_merges", false, t.path, "model");
}

// Every token id a tokenizer may produce must fit a model's vocabulary (model.vocab_size's range,
// the shards' too): checked here, at load, not after a whole corpus is tokenized.
void check_id(const BpeTokenizer::Impl& t, uint64_t id, const std::string& where) {
  if (id >= uint64_t(kMaxShardVocab))
    refuse(t.path, where, "id " + std::to_string(id) + " is beyond what a model vocabulary holds: ids must be < " +
                              std::to_string(kMaxShardVocab) + " (model.vocab_size's range is 1.." +
                              std::to_string(kMaxShardVocab) + ")");
}

void set_token(BpeTokenizer::Impl& t, uint64_t id, std::string bytes, const std::string& where) {
  check_id(t, id, where);
  if (id >= t.id_bytes.size()) t.id_bytes.resize(id + 1), t.id_used.resize(id + 1, 0);
  t.id_bytes[id] = std::move(bytes), t.id_used[id] = 1;
}

void load_added_tokens(BpeTokenizer::Impl& t, const json& root) {
  const json* list = field(root, "added_tokens");
  if (!list) return;
  if (!list->is_array()) refuse(t.path, "added_tokens", "expected an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& a = (*list)[i];
    std::string where = "added_tokens[" + std::to_string(i) + "]";
    const json* id = a.is_object() ? field(a, "id") : nullptr;
    const json* content = a.is_object() ? field(a, "content") : nullptr;
    if (!id || !id->is_number_unsigned()) refuse(t.path, where + ".id", "expected an integer id");
    if (!content || !content->is_string() || content->get_ref<const std::string&>().empty())
      refuse(t.path, where + ".content", "expected a non-empty string");
    for (const char* k : {"lstrip", "rstrip", "single_word"})
      if (flag(a, k, false, t.path, where)) refuse(t.path, where + "." + k, "true is not implemented");
    bool special = flag(a, "special", false, t.path, where);
    bool normalized = flag(a, "normalized", !special, t.path, where);
    check_id(t, id->get<uint64_t>(), where + ".id");  // before the narrowing: 2^32 + 5 must not become 5
    AddedToken tok{content->get<std::string>(), id->get<uint32_t>()};
    set_token(t, tok.id, tok.text, where + ".id");
    // As HF: normalized=false tokens are cut from the raw text first, the others from what the
    // normalizer (if any) makes of the rest.
    (normalized ? t.added_norm : t.added_raw).tokens.push_back(std::move(tok));
  }
  for (AddedSet* set : {&t.added_raw, &t.added_norm}) {
    std::stable_sort(set->tokens.begin(), set->tokens.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.text.size() > b.text.size(); });
    for (const auto& tok : set->tokens) set->first_byte[uint8_t(tok.text[0])] = true;
  }
}

void load_vocab_and_merges(BpeTokenizer::Impl& t, Sax& sax) {
  if (!sax.has_vocab) refuse(t.path, "model.vocab", "missing (expected an object token -> id)");
  if (!sax.has_merges) refuse(t.path, "model.merges", "missing (expected an array of \"a b\" or [\"a\", \"b\"])");
  const ByteLevelAlphabet alpha;
  for (auto& [text, id] : sax.vocab) {
    auto bytes = alpha.bytes(text);
    check_id(t, id, "model.vocab[\"" + text + "\"]");
    if (bytes && !t.find_token(*bytes)) {
      uint32_t one = uint32_t(id);
      t.vocab.insert(*bytes, hash_bytes(*bytes), {&one, 1});
    }
    set_token(t, id, bytes ? std::move(*bytes) : std::move(text), "model.vocab");  // outside the alphabet: decodes as itself
  }
  for (int b = 0; b < 256; ++b) {  // a byte without a token is an error when a text holds it
    auto id = t.find_token(std::string(1, char(b)));
    t.byte_id[size_t(b)] = id ? *id : kNoByteToken;
  }
  t.merges.reserve(sax.merges.size());
  for (size_t i = 0; i < sax.merges.size(); ++i) {
    const auto& [a, b] = sax.merges[i];
    auto where = [&] { return "model.merges[" + std::to_string(i) + "]"; };
    auto ab = alpha.bytes(a), bb = alpha.bytes(b);
    if (!ab || !bb) refuse(t.path, where(), "\"" + (ab ? b : a) + "\" is not made of ByteLevel characters");
    size_t na = ab->size();
    ab->append(*bb);
    auto ia = t.find_token(std::string_view(*ab).substr(0, na)), ib = t.find_token(*bb), im = t.find_token(*ab);
    if (!ia || !ib || !im) refuse(t.path, where(), "\"" + (!ia ? a : !ib ? b : a + b) + "\" is not in model.vocab");
    t.merges.insert(PairTable::key(*ia, *ib), uint64_t(i) << 32 | *im);  // a repeated pair: the later rank, as HF
  }
  t.num_merges = sax.merges.size();
}

}  // namespace

std::array<uint32_t, 256> byte_to_codepoint() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  auto t = std::make_unique<Impl>();
  t->path = path;
  std::string text = read_all(path, "a tokenizer.json (--tokenizer)");
  t->sha256 = sha256_hex(text);
  Sax sax;
  bool ok = json::sax_parse(text, &sax);
  if (!ok || !sax.error.empty()) throw Error(path + ": " + (sax.error.empty() ? "JSON: invalid" : sax.error));
  std::string().swap(text);
  const json& root = sax.root;
  if (!root.is_object() || !sax.model) refuse(path, "model", "missing (not a Hugging Face tokenizer.json?)");
  load_model_options(*t, *sax.model);
  load_normalizer(*t, root);
  load_pre_tokenizer(*t, root);
  if (const json* d = field(root, "decoder"); d && type_of(*d, path, "decoder") != "ByteLevel")
    refuse(path, "decoder.type", "\"" + type_of(*d, path, "decoder") + "\" is not implemented (ByteLevel or null)");
  load_vocab_and_merges(*t, sax);
  load_added_tokens(*t, root);

  namespace fs = std::filesystem;
  fs::path dir = fs::path(path).parent_path();
  t->name = fs::absolute(path).parent_path().filename().string();
  if (t->name.empty()) t->name = fs::path(path).stem().string();
  fs::path cfg_path = dir / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    json cfg = json::parse(read_all(cfg_path.string(), "a tokenizer_config.json (read beside --tokenizer)"), nullptr, false);
    if (cfg.is_object()) {
      if (const json* n = field(cfg, "name_or_path"); n && n->is_string() && !n->get_ref<const std::string&>().empty())
        t->name = n->get<std::string>();
      const json* eos = field(cfg, "eos_token");
      if (eos && eos->is_object()) eos = field(*eos, "content");
      if (eos && eos->is_string()) t->config_eos = eos->get<std::string>();
    }
  }
  for (char& c : t->name)
    if (c == ' ') c = '_';  // the shard attribute is "NAME sha256:HEX"
  return BpeTokenizer(std::move(t));
}

}  // namespace sb
