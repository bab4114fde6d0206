// Loss masks: /loss_mask written, read (C++ and h5py) and validated; JSONL prompt/response and chat
// records; prep synth --mask answers; bad records refused by FILE:LINE.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "tests/restamp.hpp"
#include "io/h5.hpp"
#include "io/shard.hpp"
#include "src/data/prep.hpp"
#include "src/data/tokenizer.hpp"
#include "tests/data/test_util.hpp"

using sb::ByteTokenizer;
using sb::Dataset;

namespace {

sb::ShardMeta byte_meta() { return {ByteTokenizer::kVocabSize, ByteTokenizer::kName, ByteTokenizer::kEos}; }

sb::PrepOptions out_opts(const std::string& dir) {
  sb::PrepOptions o;
  o.output = dir;
  return o;
}

std::string mask_string(const std::vector<uint8_t>& m) {
  std::string s;
  for (auto v : m) s += char('0' + v);
  return s;
}

// Replaces /loss_mask of a shard with `values` (raw HDF5, as a foreign writer could).
void replace_mask(const std::string& path, const std::vector<uint8_t>& values) {
  {
    sb::h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(f.valid());
    if (sb::h5::exists(f, "loss_mask")) H5Ldelete(f, "loss_mask", H5P_DEFAULT);
    sb::h5::write_vector(f, "loss_mask", values);
  }
  sbtest::restamp(path);
}

}  // namespace

TEST(LossMask, WrittenBackFilledAndReadAcrossFlushes) {
  auto dir = sbt::scratch("maskrw");
  // doc 0 unmasked (back-filled with 1 once doc 1 brings a mask), doc 1 masked and longer than the
  // writer's buffer (flushes mid-document), doc 2 unmasked again.
  const size_t big = 16 * sb::ShardWriter::kChunk + 1234;
  std::vector<uint32_t> d0(100, 7), d1(big), d2(50, 9);
  std::vector<uint8_t> m1(big);
  for (size_t i = 0; i < big; ++i) d1[i] = uint32_t(i % 250), m1[i] = uint8_t((i / 3) % 2);
  {
    sb::ShardWriter w(dir + "/s.h5", byte_meta());
    w.add(d0);
    w.add(d1, {}, m1);
    w.add(d2);
    w.close();
  }
  auto r = sb::ShardReader::open(dir + "/s.h5");
  ASSERT_TRUE(r.has_mask());
  r.verify();
  Dataset ds = Dataset::open(dir + "/s.h5");
  ASSERT_TRUE(ds.has_masks());
  EXPECT_EQ(ds.read_mask(0, 0, 100), std::vector<uint8_t>(100, 1));
  EXPECT_EQ(ds.read_mask(1, 0, big), m1);
  EXPECT_EQ(ds.read_mask(2, 0, 50), std::vector<uint8_t>(50, 1));
  std::vector<uint8_t> part(m1.begin() + 1000, m1.begin() + 1100);
  EXPECT_EQ(ds.read_mask(1, 1000, 100), part);  // a window keeps its part of the mask
  EXPECT_NE(sbt::error_of([&] { ds.read_mask(2, 10, 41); }).find("outside document 2"), std::string::npos);

  // A shard without masked documents has no /loss_mask; reading one gives all 1.
  {
    sb::ShardWriter w(dir + "/plain.h5", byte_meta());
    w.add(d0);
    w.close();
  }
  auto p = sb::ShardReader::open(dir + "/plain.h5");
  EXPECT_FALSE(p.has_mask());
  std::vector<uint8_t> ones(100, 0);
  p.read_mask(0, 100, ones.data());
  EXPECT_EQ(ones, std::vector<uint8_t>(100, 1));

  // The writer refuses masks of the wrong length or with values other than 0/1.
  sb::ShardWriter w(dir + "/bad.h5", byte_meta());
  std::vector<uint8_t> short_mask(99, 1), two(100, 0);
  two[5] = 2;
  EXPECT_NE(sbt::error_of([&] { w.add(d0, {}, short_mask); }).find("99 loss-mask values for 100 tokens"), std::string::npos);
  EXPECT_NE(sbt::error_of([&] { w.add(d0, {}, two); }).find("loss-mask value 2 at position 5"), std::string::npos);
}

TEST(LossMask, LayoutReadByH5py) {
  if (std::system("/usr/bin/python3 -c 'import h5py, numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no h5py";
  auto dir = sbt::scratch("maskpy");
  sbt::write_bytes(dir + "/in.jsonl", R"({"prompt": "Q: 2+2?\nA: ", "response": "4"})" "\n"
                                      R"({"text": "plain"})" "\n");
  sb::prep_text({dir + "/in.jsonl"}, "jsonl", "blank-lines", out_opts(dir + "/out"));
  // The io/README.md example, checked: one uint8 per token, 1 on the response.
  std::string py = "import h5py, numpy as np\n"
                   "f = h5py.File('" + dir + "/out/shard_00000.h5', 'r')\n"
                   "m, t, off = f['loss_mask'], f['tokens'], f['doc_offsets'][:]\n"
                   "assert m.dtype == np.uint8 and m.shape == t.shape, (m.dtype, m.shape, t.shape)\n"
                   "b, e = off[0], off[1]\n"
                   "text = bytes(t[b:e].astype(np.uint8)).decode()\n"
                   "trained = bytes(t[b:e][m[b:e] == 1].astype(np.uint8)).decode()\n"
                   "assert text == 'Q: 2+2?\\nA: 4' and trained == '4', (text, trained)\n"
                   "assert (m[off[1]:off[2]] == 1).all()\n";
  sbt::write_bytes(dir + "/check.py", py);
  EXPECT_EQ(std::system(("/usr/bin/python3 " + dir + "/check.py").c_str()), 0);
}

TEST(LossMask, ReaderRefusesBadMaskDatasetsByName) {
  auto dir = sbt::scratch("maskbad");
  std::vector<uint32_t> d(10, 3);
  std::vector<uint8_t> m(10, 1);
  for (const char* name : {"len.h5", "val.h5"}) {
    sb::ShardWriter w(dir + "/" + name, byte_meta());
    w.add(d, {}, m);
    w.close();
  }
  replace_mask(dir + "/len.h5", std::vector<uint8_t>(9, 1));
  auto msg = sbt::error_of([&] { sb::ShardReader::open(dir + "/len.h5"); });
  EXPECT_ERROR_NAMES(msg, dir + "/len.h5", "'/loss_mask' has 9 entries, expected one per token (10)");
  std::vector<uint8_t> bad(10, 0);
  bad[7] = 3;
  replace_mask(dir + "/val.h5", bad);
  auto r = sb::ShardReader::open(dir + "/val.h5");
  msg = sbt::error_of([&] { r.verify(); });
  EXPECT_ERROR_NAMES(msg, dir + "/val.h5", "'/loss_mask' has value 3 at token 7, expected 0 or 1");
  msg = sbt::error_of([&] { Dataset::open(dir + "/val.h5").read_mask(0, 0, 10); });
  EXPECT_ERROR_NAMES(msg, dir + "/val.h5", "value 3 at token 7");
}

TEST(LossMask, PromptResponseAndChatRecords) {
  auto dir = sbt::scratch("maskjsonl");
  std::string in;
  in += R"({"prompt": "ab", "response": "cd", "id": 17})" "\n";  // other fields are ignored
  in += R"({"text": "xyz"})" "\n";
  in += R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},)"
        R"( {"role": "assistant", "content": "yo"}, {"role": "user", "content": ""}, {"role": "assistant", "content": "ok"}]})" "\n";
  in += R"({"prompt": "", "response": "r"})" "\n";
  sbt::write_bytes(dir + "/in.jsonl", in);
  sb::prep_text({dir + "/in.jsonl"}, "jsonl", "blank-lines", out_opts(dir + "/out"));
  Dataset ds = Dataset::open(dir + "/out");
  ASSERT_EQ(ds.num_docs(), 4u);
  ASSERT_TRUE(ds.has_masks());
  auto text = [&](uint64_t d) { return ByteTokenizer::decode(ds.read_doc(d)); };
  auto mask = [&](uint64_t d) { return mask_string(ds.read_mask(d, 0, ds.doc_length(d))); };
  EXPECT_EQ(text(0), "abcd");
  EXPECT_EQ(mask(0), "0011");
  EXPECT_EQ(text(1), "xyz");
  EXPECT_EQ(mask(1), "111");  // "text": everything trained
  // The plain chat template: "<|role|>\n" + content + "\n" per turn; trained: assistant content + "\n".
  const std::string chat = "<|system|>\ns\n<|user|>\nhi\n<|assistant|>\nyo\n<|user|>\n\n<|assistant|>\nok\n";
  EXPECT_EQ(text(2), chat);
  std::string want;
  for (auto [piece, on] : std::vector<std::pair<std::string, bool>>{{"<|system|>\ns\n<|user|>\nhi\n<|assistant|>\n", false},
                                                                  {"yo\n", true}, {"<|user|>\n\n<|assistant|>\n", false},
                                                                  {"ok\n", true}})
    want += std::string(piece.size(), on ? '1' : '0');
  EXPECT_EQ(mask(2), want);
  EXPECT_EQ(mask(3), "1");

  // A corpus of "text" records only stays without /loss_mask.
  sbt::write_bytes(dir + "/plain.jsonl", R"({"text": "abc"})" "\n");
  sb::prep_text({dir + "/plain.jsonl"}, "jsonl", "blank-lines", out_opts(dir + "/plain"));
  EXPECT_FALSE(Dataset::open(dir + "/plain").has_masks());
}

TEST(LossMask, BadRecordsNameFileAndLine) {
  auto dir = sbt::scratch("maskrec");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "p", "response": ""})", "field \"response\" is empty"},
      {R"({"prompt": "p"})", "has no field \"response\""},
      {R"({"response": "r"})", "has no field \"prompt\""},
      {R"({"prompt": 3, "response": "r"})", "field \"prompt\" is number, expected a string"},
      {R"({"text": "t", "prompt": "p", "response": "r"})", "exactly one of"},
      {R"({"messages": "hi"})", "non-empty array"},
      {R"({"messages": []})", "non-empty array"},
      {R"({"messages": [{"role": "user", "content": "q"}]})", "no assistant turn"},
      {R"({"messages": [{"role": "user", "content": ["q"]}, {"role": "assistant", "content": "a"}]})",
       "message 0's field \"content\" is array, expected a string"},
      {R"({"messages": [{"role": "robot", "content": "q"}]})", "message 0 has role \"robot\", expected system, user or assistant"},
      {R"({"messages": [{"role": "user", "content": "q"}, {"content": "a"}]})", "message 1 has no field \"role\""},
      {R"({"messages": [{"role": "assistant", "content": ""}]})", "assistant turn with empty content"},
      {R"({"messages": [7]})", "message 0 is number"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string file = dir + "/c" + std::to_string(i) + ".jsonl";
    sbt::write_bytes(file, "{\"text\": \"fine\"}\n\n" + cases[i].first + "\n");
    auto msg = sbt::error_of([&] { sb::prep_text({file}, "jsonl", "", out_opts(dir + "/o" + std::to_string(i))); });
    EXPECT_NE(msg.find(file + ":3: "), std::string::npos) << cases[i].first << " -> " << msg;
    EXPECT_NE(msg.find(cases[i].second), std::string::npos) << cases[i].first << " -> " << msg;
  }
}

TEST(LossMask, SynthMasksTheAnswersOrNothing) {
  auto dir = sbt::scratch("masksynth");
  sb::SynthOptions so;
  so.preset = "uniform", so.docs = 40, so.seed = 5, so.max_len = 600, so.min_len = 60;
  auto o = out_opts(dir + "/none");
  sb::prep_synth(so, o);
  EXPECT_FALSE(Dataset::open(dir + "/none").has_masks());
  o = out_opts(dir + "/answers");
  o.mask = "answers";
  sb::prep_synth(so, o);
  Dataset ds = Dataset::open(dir + "/answers");
  ASSERT_TRUE(ds.has_masks());
  int tasks = 0;
  for (uint64_t d = 0; d < ds.num_docs(); ++d) {
    auto m = ds.read_mask(d, 0, ds.doc_length(d));
    auto t = ds.task(d);
    tasks += t.type != sb::kTaskNone;
    for (uint64_t i = 0; i < m.size(); ++i)
      ASSERT_EQ(m[i], t.type != sb::kTaskNone && i >= t.begin && i < t.end) << "doc " << d << " token " << i;
  }
  EXPECT_GT(tasks, 20);
  o = out_opts(dir + "/bad");
  o.mask = "questions";
  EXPECT_NE(sbt::error_of([&] { sb::prep_synth(so, o); }).find("--mask questions: expected none or answers"), std::string::npos);
}

// --ask all (training documents): every key of a multi-key / key-value document is asked, each
// answer trained; the stored task span stays the last question's answer, as the eval reads it.
TEST(LossMask, SynthAskAllTrainsEveryAnswer) {
  auto dir = sbt::scratch("maskaskall");
  sb::SynthOptions so;
  so.preset = "uniform", so.docs = 24, so.seed = 7, so.max_len = 6000, so.min_len = 3000, so.ask_all = true;
  auto o = out_opts(dir + "/all");
  o.mask = "answers";
  sb::prep_synth(so, o);
  Dataset ds = Dataset::open(dir + "/all");
  int many = 0;
  for (uint64_t d = 0; d < ds.num_docs(); ++d) {
    auto m = ds.read_mask(d, 0, ds.doc_length(d));
    auto toks = ds.read_doc(d);
    auto t = ds.task(d);
    ASSERT_NE(t.type, sb::kTaskNone) << "doc " << d;
    std::vector<std::pair<uint64_t, uint64_t>> runs;  // the trained spans
    for (uint64_t i = 0; i < m.size(); ++i)
      if (m[i] && (i == 0 || !m[i - 1])) runs.emplace_back(i, i + 1);
      else if (m[i]) runs.back().second = i + 1;
    ASSERT_FALSE(runs.empty()) << "doc " << d;
    EXPECT_EQ(runs.back(), std::make_pair(t.begin, t.end)) << "doc " << d << ": the task span is the last answer";
    for (auto [b, e] : runs) {  // every question ends "... is " right before its answer
      std::string before;
      for (uint64_t i = b - 3; i < b; ++i) before += char(toks[i]);
      EXPECT_EQ(before, "is ") << "doc " << d << " answer at " << b;
    }
    if (t.type == sb::kTaskPasskey) EXPECT_EQ(runs.size(), 1u) << "doc " << d;
    else EXPECT_GE(runs.size(), 2u) << "doc " << d;
    many += runs.size() >= 2;
  }
  EXPECT_GT(many, 8);
}
