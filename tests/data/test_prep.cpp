// prep text/bin/synth round trips and errors; synthetic corpus determinism, tasks and length presets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "io/shard.hpp"
#include "src/data/inspect.hpp"
#include "src/data/prep.hpp"
#include "src/data/synth.hpp"
#include "src/data/tokenizer.hpp"
#include "tests/data/test_util.hpp"

using sb::ByteTokenizer;
using sb::Dataset;

namespace {

std::vector<std::string> read_texts(const Dataset& ds) {
  std::vector<std::string> out;
  for (uint64_t d = 0; d < ds.num_docs(); ++d) out.push_back(ByteTokenizer::decode(ds.read_doc(d)));
  return out;
}

sb::PrepOptions out_opts(const std::string& dir, uint64_t shard_tokens = 1 << 24) {
  sb::PrepOptions o;
  o.output = dir, o.shard_tokens = shard_tokens;
  return o;
}

void write_llmc(const std::string& path, const std::vector<uint16_t>& toks, int32_t magic = 20240520,
                int32_t version = 1, int64_t claimed = -1) {
  int32_t header[256] = {};
  header[0] = magic, header[1] = version, header[2] = int32_t(claimed < 0 ? toks.size() : claimed);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(toks.data()), std::streamsize(2 * toks.size()));
}

}  // namespace

TEST(Tokenizer, BytesRoundTrip) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(char(c));
  auto ids = ByteTokenizer::encode(all);
  ASSERT_EQ(ids.size(), 256u);
  EXPECT_EQ(ids[255], 255u);
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
  ids.push_back(ByteTokenizer::kEos);
  EXPECT_EQ(ByteTokenizer::decode(ids), all);  // specials are dropped
  std::vector<uint32_t> bad = {259};
  EXPECT_THROW(ByteTokenizer::decode(bad), sb::Error);
}

TEST(PrepText, BlankLinesRoundTripIncludingUtf8AndRawBytes) {
  auto dir = sbt::scratch("text");
  std::vector<std::string> docs = {"Hello world.\nSecond line of the first doc.",
                                   "Grüße aus Köln — ünïcödé ✓ 日本語 🎉",
                                   std::string("raw \xff\xfe bytes\tand tabs\r"),
                                   "  leading spaces kept\nand a last line"};
  std::string text = "\n\n";  // leading blank lines are no document
  for (size_t i = 0; i < docs.size(); ++i) text += docs[i] + (i % 2 ? "\n\n\n" : "\n \t\n");
  sbt::write_bytes(dir + "/in.txt", text);
  auto st = sb::prep_text({dir + "/in.txt"}, "text", "blank-lines", out_opts(dir + "/out"));
  EXPECT_EQ(st.documents, docs.size());
  auto ds = Dataset::open(dir + "/out");
  EXPECT_EQ(read_texts(ds), docs);
  EXPECT_EQ(ds.vocab_size(), 259);
  EXPECT_EQ(ds.eos_id(), 257);
  EXPECT_EQ(ds.tokenizer(), "byte");
  uint64_t bytes = 0;
  for (auto& d : docs) bytes += d.size();
  EXPECT_EQ(ds.num_tokens(), bytes);
}

TEST(PrepText, OneDocumentPerFileKeepsEveryByte) {
  auto dir = sbt::scratch("files");
  std::vector<std::string> docs = {"first\n\n\nwith blank lines inside\n", std::string("\0nul\0bytes", 10), "ñ"};
  std::vector<std::string> inputs;
  for (size_t i = 0; i < docs.size(); ++i) {
    inputs.push_back(dir + "/f" + std::to_string(i) + ".txt");
    sbt::write_bytes(inputs.back(), docs[i]);
  }
  sb::prep_text(inputs, "text", "file", out_opts(dir + "/out"));
  EXPECT_EQ(read_texts(Dataset::open(dir + "/out")), docs);
}

TEST(PrepText, JsonlWithEscapes) {
  auto dir = sbt::scratch("jsonl");
  std::vector<std::string> docs = {"line one\nline two", "quote \" backslash \\ tab \t", "é ü 中文 🎉",
                                   "control \x01 char", "{\"nested\": [1, 2]}"};
  std::string text;
  for (const auto& d : docs) text += nlohmann::json{{"id", 1}, {"text", d}}.dump() + "\n";
  text += "\n";  // a trailing blank line is fine
  text += R"({"text": "unicode escape \u00e9\ud83c\udf89"})" "\n";
  docs.push_back("unicode escape é🎉");
  sbt::write_bytes(dir + "/in.jsonl", text);
  sb::prep_text({dir + "/in.jsonl"}, "jsonl", "blank-lines", out_opts(dir + "/out"));
  EXPECT_EQ(read_texts(Dataset::open(dir + "/out")), docs);
}

TEST(PrepText, BadJsonlLineNamesFileAndLine) {
  auto dir = sbt::scratch("jsonlbad");
  sbt::write_bytes(dir + "/a.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  auto msg = sbt::error_of([&] { sb::prep_text({dir + "/a.jsonl"}, "jsonl", "", out_opts(dir + "/o1")); });
  EXPECT_NE(msg.find(dir + "/a.jsonl:2: invalid JSON"), std::string::npos) << msg;
  sbt::write_bytes(dir + "/b.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n");
  msg = sbt::error_of([&] { sb::prep_text({dir + "/b.jsonl"}, "jsonl", "", out_opts(dir + "/o2")); });
  EXPECT_NE(msg.find(dir + "/b.jsonl:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"text\""), std::string::npos) << msg;
  // A failed prep leaves no shard behind (only complete shards are renamed into place).
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    EXPECT_NE(e.path().extension(), ".h5") << e.path();
}

TEST(PrepText, RefusesExistingShardsUnlessOverwrite) {
  auto dir = sbt::scratch("overwrite");
  sbt::write_bytes(dir + "/in.txt", "a\n\nb\n");
  sb::prep_text({dir + "/in.txt"}, "text", "blank-lines", out_opts(dir + "/out"));
  auto msg = sbt::error_of([&] { sb::prep_text({dir + "/in.txt"}, "text", "blank-lines", out_opts(dir + "/out")); });
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  auto o = out_opts(dir + "/out");
  o.overwrite = true;
  sbt::write_bytes(dir + "/in.txt", "c\n");
  sb::prep_text({dir + "/in.txt"}, "text", "blank-lines", o);
  EXPECT_EQ(read_texts(Dataset::open(dir + "/out")), std::vector<std::string>{"c"});
}

TEST(PrepBin, LlmcTokensSplitAtEot) {
  auto dir = sbt::scratch("bin");
  const uint16_t E = 50256;
  // llm.c puts an EOT before every document; the last one here has no closing EOT.
  write_llmc(dir + "/a.bin", {E, 10, 11, 12, E, 50255, E, E, 7});
  write_llmc(dir + "/b.bin", {E, 1, 2, 3, 4});
  auto st = sb::prep_bin({dir + "/a.bin", dir + "/b.bin"}, E, 50257, out_opts(dir + "/out"));
  EXPECT_EQ(st.documents, 4u);
  auto ds = Dataset::open(dir + "/out");
  EXPECT_EQ(ds.tokenizer(), "gpt2");
  EXPECT_EQ(ds.vocab_size(), 50257);
  EXPECT_EQ(ds.eos_id(), E);
  std::vector<std::vector<uint32_t>> want = {{10, 11, 12}, {50255}, {7}, {1, 2, 3, 4}};
  ASSERT_EQ(ds.num_docs(), want.size());
  for (size_t d = 0; d < want.size(); ++d) EXPECT_EQ(ds.read_doc(d), want[d]);
}

TEST(PrepBin, HeaderErrorsNameTheFile) {
  auto dir = sbt::scratch("binbad");
  auto err = [&](const std::string& name) {
    return sbt::error_of([&] { sb::prep_bin({dir + "/" + name}, 50256, 50257, out_opts(dir + "/out_" + name)); });
  };
  write_llmc(dir + "/magic.bin", {1, 2}, 1234);
  EXPECT_ERROR_NAMES(err("magic.bin"), "magic.bin", "magic is 1234, expected 20240520");
  write_llmc(dir + "/version.bin", {1, 2}, 20240520, 3);
  EXPECT_ERROR_NAMES(err("version.bin"), "version.bin", "version is 3, expected 1");
  write_llmc(dir + "/size.bin", {1, 2}, 20240520, 1, 5);
  EXPECT_ERROR_NAMES(err("size.bin"), "size.bin", "header says 5 tokens");
  sbt::write_bytes(dir + "/short.bin", "tiny");
  EXPECT_ERROR_NAMES(err("short.bin"), "short.bin", "too short");
  write_llmc(dir + "/vocab.bin", {1, 60000});
  EXPECT_ERROR_NAMES(err("vocab.bin"), "vocab.bin", "60000");
}

TEST(Prep, ShardsSplitAtShardTokensOnDocumentBoundaries) {
  auto dir = sbt::scratch("split");
  std::string text;
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back(std::string(size_t(10 + i), char('a' + i % 26)));
  for (auto& d : docs) text += d + "\n\n";
  sbt::write_bytes(dir + "/in.txt", text);
  auto st = sb::prep_text({dir + "/in.txt"}, "text", "blank-lines", out_opts(dir + "/out", 100));
  EXPECT_GT(st.shards, 5u);
  EXPECT_EQ(st.files.front(), dir + "/out/shard_00000.h5");
  auto ds = Dataset::open(dir + "/out");
  EXPECT_EQ(ds.shards().size(), st.shards);
  for (const auto& s : ds.shards()) EXPECT_TRUE(s.num_tokens() <= 100 || s.num_docs() == 1) << s.path();
  EXPECT_EQ(read_texts(ds), docs);
}

// ---------------------------------------------------------------------------------------------
// Synthetic corpus

namespace {
sb::SynthOptions synth_opts(const std::string& preset, uint64_t docs, uint64_t seed, uint64_t max_len) {
  sb::SynthOptions o;
  o.preset = preset, o.docs = docs, o.seed = seed, o.max_len = max_len, o.min_len = 16;
  return o;
}
}  // namespace

TEST(Synth, DeterministicForASeed) {
  auto dir = sbt::scratch("synthdet");
  auto o = synth_opts("longalign", 60, 5, 8192);
  sb::prep_synth(o, out_opts(dir + "/a", 50000));
  sb::prep_synth(o, out_opts(dir + "/b", 50000));
  o.seed = 6;
  sb::prep_synth(o, out_opts(dir + "/c", 50000));
  auto a = Dataset::open(dir + "/a"), b = Dataset::open(dir + "/b"), c = Dataset::open(dir + "/c");
  EXPECT_EQ(read_texts(a), read_texts(b));
  EXPECT_NE(read_texts(a), read_texts(c));
  for (uint64_t d = 0; d < a.num_docs(); ++d) {
    EXPECT_EQ(a.task(d).type, b.task(d).type);
    EXPECT_EQ(a.task(d).begin, b.task(d).begin);
  }
}

TEST(Synth, TasksAnswerAtTheEndEvidenceFarBefore) {
  auto o = synth_opts("uniform", 300, 11, 6000);
  sb::SynthCorpus corpus(o);
  std::vector<int> per_type(4, 0);
  for (uint64_t i = 0; i < o.docs; ++i) {
    auto d = corpus.doc(i);
    SCOPED_TRACE("doc " + std::to_string(i));
    per_type[d.task.type]++;
    if (d.task.type == sb::kTaskNone) {
      EXPECT_LT(d.text.size(), sb::kMinTaskLen);
      continue;
    }
    ASSERT_EQ(d.task.end, d.text.size()) << "the answer ends the document";
    std::string answer = d.text.substr(d.task.begin, d.task.end - d.task.begin);
    std::string before = d.text.substr(0, d.task.begin);
    size_t q = before.rfind('\n');
    ASSERT_NE(q, std::string::npos);
    std::string context = before.substr(0, q), question = before.substr(q + 1);
    if (d.task.type == sb::kTaskPasskey) {
      EXPECT_EQ(question, "What is the pass key? The pass key is ");
      EXPECT_EQ(answer.size(), 5u);
      EXPECT_NE(context.find("The pass key is " + answer + ". Remember it."), std::string::npos);
    } else if (d.task.type == sb::kTaskMultikey) {
      auto key = question.substr(question.rfind("for ") + 4);
      key = key.substr(0, key.size() - 4);  // drop " is "
      EXPECT_NE(context.find("The special magic number for " + key + " is " + answer + "."), std::string::npos) << question;
      EXPECT_GE(std::count(context.begin(), context.end(), '.'), 2);
    } else {
      auto k0 = question.find('"') + 1;
      auto key = question.substr(k0, question.find('"', k0) - k0);
      EXPECT_NE(context.find("\"" + key + "\": \"" + answer + "\""), std::string::npos) << question;
    }
    // The evidence is not next to the question: some filler separates them.
    EXPECT_GT(context.size(), d.text.size() / 4);
    // Filler has no digits: the first digit of a passkey document is the key in its needle,
    // so the answer is only recoverable from that far-away evidence.
    if (d.task.type == sb::kTaskPasskey) {
      EXPECT_EQ(d.text.find_first_of("0123456789"), context.find("The pass key is ") + 16);
    }
  }
  EXPECT_GT(per_type[1], 50);
  EXPECT_GT(per_type[2], 50);
  EXPECT_GT(per_type[3], 50);
}

TEST(Synth, FillerLooksLikeText) {
  auto o = synth_opts("fixed", 1, 3, 65536);
  sb::SynthCorpus corpus(o);
  auto d = corpus.doc(0);
  ASSERT_EQ(d.text.size(), 65536u);
  // Many distinct words, sentences with capitals and full stops, word lengths like English.
  std::set<std::string> words;
  std::string w;
  size_t letters = 0, spaces = 0, stops = 0, caps = 0;
  for (char c : d.text) {
    if (c >= 'a' && c <= 'z') w += c, ++letters;
    else {
      if (!w.empty()) words.insert(w), w.clear();
      spaces += c == ' ', stops += c == '.', caps += c >= 'A' && c <= 'Z';
    }
  }
  EXPECT_GT(words.size(), 2000u);
  EXPECT_GT(stops, 400u);
  EXPECT_GT(caps, 400u);
  double mean_word = double(letters) / double(spaces);
  EXPECT_GT(mean_word, 3.0);
  EXPECT_LT(mean_word, 12.0);
}

TEST(Synth, LengthPresetsHaveTheirShape) {
  const uint64_t mx = 16384, n = 4000;
  auto lengths = [&](const std::string& preset) {
    sb::Rng rng(42);
    std::vector<uint64_t> v;
    for (uint64_t i = 0; i < n; ++i) v.push_back(sb::sample_length(preset, rng, 16, mx));
    std::sort(v.begin(), v.end());
    return v;
  };
  auto la = lengths("longalign");
  EXPECT_GE(la.front(), 16u);
  EXPECT_EQ(la.back(), mx) << "longalign reaches max_len";
  uint64_t med = la[n / 2];
  EXPECT_GT(med, mx / 32);  // p50 ~ max/16
  EXPECT_LT(med, mx / 8);
  auto at_max = std::count(la.begin(), la.end(), mx);
  EXPECT_GE(at_max, 10);  // a few at max
  EXPECT_LT(at_max, int64_t(n / 10));
  EXPECT_GT(la[n * 99 / 100], mx / 2) << "long tail";

  auto cq = lengths("chatqa2");  // bimodal: mass near max/32 and near max/2, little in between
  auto count_in = [&](const std::vector<uint64_t>& v, uint64_t lo, uint64_t hi) {
    return std::count_if(v.begin(), v.end(), [&](uint64_t x) { return x >= lo && x < hi; });
  };
  EXPECT_GT(count_in(cq, mx / 128, mx / 12), int64_t(n / 2));
  EXPECT_GT(count_in(cq, mx / 4, mx + 1), int64_t(n / 4));
  EXPECT_LT(count_in(cq, mx / 10, mx / 5), int64_t(n / 20));

  auto un = lengths("uniform");
  double mean = 0;
  for (auto x : un) mean += double(x) / double(n);
  EXPECT_NEAR(mean, (16 + mx) / 2.0, mx * 0.03);
  EXPECT_EQ(lengths("fixed"), std::vector<uint64_t>(n, mx));

  sb::Rng rng(1);
  EXPECT_NE(sbt::error_of([&] { sb::sample_length("zipf", rng, 1, 10); }).find("prep.preset"), std::string::npos);
  EXPECT_NE(sbt::error_of([&] { sb::sample_length("fixed", rng, 10, 5); }).find("min_len"), std::string::npos);
}

TEST(Synth, DocumentsHitTheirTargetLengthAndInspectReportsThem) {
  auto dir = sbt::scratch("synthlen");
  auto o = synth_opts("chatqa2", 200, 9, 4096);
  auto st = sb::prep_synth(o, out_opts(dir, 100000));
  auto ds = Dataset::open(dir);
  ASSERT_EQ(ds.num_docs(), 200u);
  EXPECT_EQ(st.tokens, ds.num_tokens());
  for (uint64_t i = 0; i < ds.num_docs(); ++i) {
    sb::Rng rng(sb::mix_seed(9, i));  // the generator draws each length first from its own stream
    EXPECT_EQ(ds.doc_length(i), sb::sample_length("chatqa2", rng, 16, 4096));
  }
  auto r = sb::dataset_report(ds, true);
  EXPECT_EQ(r["documents"].get<uint64_t>(), 200u);
  EXPECT_EQ(r["tokens"].get<uint64_t>(), ds.num_tokens());
  uint64_t hist = 0, tasks = 0;
  for (auto& h : r["histogram"]) hist += h["count"].get<uint64_t>();
  for (auto& [k, v] : r["tasks"].items()) tasks += v.get<uint64_t>();
  EXPECT_EQ(hist, 200u);
  EXPECT_EQ(tasks, 200u);
  EXPECT_LE(r["lengths"]["median"].get<uint64_t>(), r["lengths"]["p90"].get<uint64_t>());
  EXPECT_LE(r["lengths"]["p99"].get<uint64_t>(), r["lengths"]["max"].get<uint64_t>());
  auto text = sb::format_dataset_report(r);
  EXPECT_NE(text.find("length histogram"), std::string::npos);
}
