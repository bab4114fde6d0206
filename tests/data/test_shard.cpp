// Shard writer/reader round trips, every reader check against a crafted bad file (written with
// the HDF5 C API directly), datasets of several shards, and the deterministic train/val split.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "io/shard.hpp"
#include "tests/data/test_util.hpp"

using sb::Dataset;
using sb::ShardReader;
using sb::ShardWriter;
using sb::TaskSpan;

namespace {

// Everything a shard file holds, so a test can break one field at a time.
struct RawShard {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> offsets;
  bool tokens_int64 = false;       // wrong dtype of /tokens
  bool with_format = true;
  std::string format = "sparsebalance-shard";
  int64_t version = 1, vocab = 259, eos = 257;
  std::vector<uint8_t> types;      // task data when non-empty
  std::vector<uint64_t> spans;
};

void attr_int(hid_t f, const char* name, int64_t v) {
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
  H5Aclose(a), H5Sclose(s);
}
void attr_str(hid_t f, const char* name, const std::string& v) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, v.size());
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Awrite(a, t, v.data()), 0);
  H5Aclose(a), H5Sclose(s), H5Tclose(t);
}
void dataset(hid_t f, const char* name, hid_t ftype, hid_t mtype, const void* data, std::vector<hsize_t> dims) {
  hid_t s = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  ASSERT_GE(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  H5Dclose(d), H5Sclose(s);
}

void write_raw(const std::string& path, const RawShard& r) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  if (r.tokens_int64) {
    std::vector<int64_t> t(r.tokens.begin(), r.tokens.end());
    dataset(f, "tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, t.data(), {t.size()});
  } else {
    dataset(f, "tokens", H5T_STD_U32LE, H5T_NATIVE_UINT32, r.tokens.data(), {r.tokens.size()});
  }
  dataset(f, "doc_offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, r.offsets.data(), {r.offsets.size()});
  if (!r.types.empty()) {
    dataset(f, "task_type", H5T_STD_U8LE, H5T_NATIVE_UINT8, r.types.data(), {r.types.size()});
    dataset(f, "answer_spans", H5T_STD_U64LE, H5T_NATIVE_UINT64, r.spans.data(), {r.types.size(), 2});
  }
  if (r.with_format) attr_str(f, "format", r.format);
  attr_int(f, "version", r.version);
  attr_int(f, "vocab_size", r.vocab);
  attr_str(f, "tokenizer", "byte");
  attr_int(f, "eos_id", r.eos);
  H5Fclose(f);
}

// Three documents "abc", "", "hello" with a passkey-like task on the last.
RawShard good_raw() {
  RawShard r;
  for (char c : std::string("abchello")) r.tokens.push_back(uint8_t(c));
  r.offsets = {0, 3, 3, 8};
  r.types = {0, 0, 1};
  r.spans = {0, 0, 0, 0, 2, 5};
  return r;
}

std::string open_error(const std::string& path) {
  return sbt::error_of([&] { Dataset::open(path); });
}

}  // namespace

TEST(Shard, WriterReaderRoundTripAcrossChunks) {
  auto dir = sbt::scratch("rt");
  auto path = dir + "/a.h5";
  // Documents that cross chunk and flush boundaries, plus an empty one.
  std::vector<std::vector<uint32_t>> docs = {{1, 2, 3}, {}, {}, std::vector<uint32_t>(ShardWriter::kChunk * 17 + 5)};
  for (size_t i = 0; i < docs[3].size(); ++i) docs[3][i] = uint32_t((i * 2654435761u) % 259);
  docs.push_back(std::vector<uint32_t>(1000, 258));
  {
    ShardWriter w(path, {259, "byte", 257});
    for (size_t d = 0; d < docs.size(); ++d)
      w.add(docs[d], d == 3 ? TaskSpan{2, 10, 20} : TaskSpan{});
    EXPECT_FALSE(std::filesystem::exists(path)) << "only the temporary file exists before close()";
    w.close();
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto ds = Dataset::open(path);
  ASSERT_EQ(ds.num_docs(), docs.size());
  uint64_t total = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(ds.doc_length(d), docs[d].size());
    EXPECT_EQ(ds.read_doc(d), docs[d]) << "doc " << d;
    total += docs[d].size();
  }
  EXPECT_EQ(ds.num_tokens(), total);
  EXPECT_EQ(ds.vocab_size(), 259);
  EXPECT_EQ(ds.eos_id(), 257);
  EXPECT_EQ(ds.tokenizer(), "byte");
  EXPECT_EQ(ds.task(3).type, 2);
  EXPECT_EQ(ds.task(3).begin, 10u);
  EXPECT_EQ(ds.task(3).end, 20u);
  EXPECT_EQ(ds.task(0).type, 0);
  ds.verify();
  EXPECT_NE(sbt::error_of([&] { ds.read_doc(docs.size()); }).find("out of range"), std::string::npos);
}

TEST(Shard, WriterRejectsBadInputAndLeavesNoFile) {
  auto dir = sbt::scratch("wbad");
  auto path = dir + "/w.h5";
  {
    ShardWriter w(path, {259, "byte", 257});
    std::vector<uint32_t> bad = {1, 259};
    EXPECT_NE(sbt::error_of([&] { w.add(bad); }).find("vocab_size 259"), std::string::npos);
    std::vector<uint32_t> ok = {1, 2};
    EXPECT_NE(sbt::error_of([&] { w.add(ok, {1, 1, 3}); }).find("answer span"), std::string::npos);
  }  // destroyed without close(): the temporary file goes away
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Shard, RawGoodFileReads) {
  auto path = sbt::scratch("raw") + "/good.h5";
  write_raw(path, good_raw());
  auto ds = Dataset::open(path);
  ASSERT_EQ(ds.num_docs(), 3u);
  auto d2 = ds.read_doc(2);
  EXPECT_EQ(std::string(d2.begin(), d2.end()), "hello");
  EXPECT_EQ(ds.task(2).begin, 2u);
}

TEST(Shard, ReaderChecksEveryField) {
  auto dir = sbt::scratch("bad");
  auto check = [&](const std::string& name, auto&& mutate, const std::string& field, const std::string& what) {
    auto path = dir + "/" + name + ".h5";
    RawShard r = good_raw();
    mutate(r);
    write_raw(path, r);
    auto msg = open_error(path);
    SCOPED_TRACE(name);
    EXPECT_ERROR_NAMES(msg, path, field);
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  check("dtype", [](RawShard& r) { r.tokens_int64 = true; }, "'/tokens'", "expected uint32");
  check("decreasing", [](RawShard& r) { r.offsets = {0, 5, 3, 8}; }, "'/doc_offsets'", "decreases");
  check("beyond", [](RawShard& r) { r.offsets = {0, 3, 9, 8}; }, "'/doc_offsets'", "beyond");
  check("short", [](RawShard& r) { r.offsets = {0, 3, 3, 7}; }, "'/doc_offsets'", "ends at 7");
  check("start", [](RawShard& r) { r.offsets = {1, 3, 3, 8}; }, "'/doc_offsets'", "expected 0");
  check("noformat", [](RawShard& r) { r.with_format = false; }, "'format'", "missing");
  check("otherformat", [](RawShard& r) { r.format = "sparsebalance-checkpoint"; }, "'format'", "expected \"sparsebalance-shard\"");
  check("version", [](RawShard& r) { r.version = 2; }, "'version'", "expected 1");
  check("eos", [](RawShard& r) { r.eos = 300; }, "'eos_id'", "vocab_size");
  check("span", [](RawShard& r) { r.spans[5] = 6; }, "'/answer_spans'", "not inside");
  check("spanempty", [](RawShard& r) { r.spans[4] = 5; }, "'/answer_spans'", "begin < end");
  check("tasktype", [](RawShard& r) { r.types[0] = 9; }, "'/task_type'", "expected 0..3");
  check("tasklen", [](RawShard& r) { r.types.pop_back(), r.spans.resize(4); }, "'/task_type'", "one per document");
}

TEST(Shard, TruncatedFile) {
  auto dir = sbt::scratch("trunc");
  auto path = dir + "/t.h5";
  {
    ShardWriter w(path, {259, "byte", 257});
    std::vector<uint32_t> doc(100000, 65);
    w.add(doc);
    w.close();
  }
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  auto msg = open_error(path);
  EXPECT_ERROR_NAMES(msg, path, "truncated");
}

TEST(Shard, TokenIdOutOfRange) {
  auto path = sbt::scratch("ids") + "/ids.h5";
  RawShard r = good_raw();
  r.tokens[6] = 300;  // inside document 2 ("hello")
  write_raw(path, r);
  auto ds = Dataset::open(path);  // header and offsets are fine: open succeeds
  EXPECT_EQ(ds.read_doc(0).size(), 3u);  // other documents stay readable
  auto msg = sbt::error_of([&] { ds.read_doc(2); });
  EXPECT_ERROR_NAMES(msg, path, "'/tokens'");
  EXPECT_NE(msg.find("id 300"), std::string::npos) << msg;
  EXPECT_NE(msg.find("document 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size 259"), std::string::npos) << msg;
  msg = sbt::error_of([&] { ds.verify(); });
  EXPECT_ERROR_NAMES(msg, path, "'/tokens'");
  EXPECT_NE(msg.find("token 6"), std::string::npos) << msg;
}

TEST(Shard, MissingFileAndEmptyDirectory) {
  auto dir = sbt::scratch("missing");
  EXPECT_ERROR_NAMES(open_error(dir + "/nope.h5"), "nope.h5", "no such file");
  EXPECT_ERROR_NAMES(open_error(dir), dir, "no *.h5 shards");
  sbt::write_bytes(dir + "/junk.h5", "not hdf5 at all");
  EXPECT_ERROR_NAMES(open_error(dir), "junk.h5", "not a readable HDF5 file");
}

TEST(Dataset, SeveralShardsInNameOrder) {
  auto dir = sbt::scratch("multi");
  // Written out of order: the dataset sorts by name.
  std::vector<std::vector<uint32_t>> all;
  for (int s : {2, 0, 1}) {
    ShardWriter w(dir + "/part_" + std::to_string(s) + ".h5", {259, "byte", 257});
    for (int d = 0; d < 3 + s; ++d) {
      std::vector<uint32_t> doc(size_t(10 * s + d + 1), uint32_t(s * 10 + d));
      w.add(doc);
    }
    w.close();
  }
  for (int s = 0; s < 3; ++s)
    for (int d = 0; d < 3 + s; ++d) all.push_back(std::vector<uint32_t>(size_t(10 * s + d + 1), uint32_t(s * 10 + d)));
  auto ds = Dataset::open(dir);
  ASSERT_EQ(ds.shards().size(), 3u);
  ASSERT_EQ(ds.num_docs(), all.size());
  for (uint64_t d = 0; d < ds.num_docs(); ++d) {
    EXPECT_EQ(ds.doc_length(d), all[d].size());
    EXPECT_EQ(ds.read_doc(d), all[d]);
  }
  // A shard with another tokenizer cannot join.
  {
    ShardWriter w(dir + "/part_3.h5", {50257, "gpt2", 50256});
    std::vector<uint32_t> doc = {1};
    w.add(doc);
    w.close();
  }
  auto msg = open_error(dir);
  EXPECT_ERROR_NAMES(msg, "part_3.h5", "vocab_size/tokenizer/eos_id");
}

TEST(Dataset, TrainValSplitIsDeterministicAndDisjoint) {
  auto path = sbt::scratch("split") + "/s.h5";
  {
    ShardWriter w(path, {259, "byte", 257});
    for (int d = 0; d < 101; ++d) {
      std::vector<uint32_t> doc(size_t(d % 7), 1);
      w.add(doc);
    }
    w.close();
  }
  auto ds = Dataset::open(path);
  auto tr = ds.train_docs(7, 0.1), va = ds.val_docs(7, 0.1);
  EXPECT_EQ(va.size(), 10u);  // round(0.1 * 101)
  EXPECT_EQ(tr.size() + va.size(), 101u);
  std::set<uint64_t> all(tr.begin(), tr.end());
  all.insert(va.begin(), va.end());
  EXPECT_EQ(all.size(), 101u);  // disjoint and complete
  EXPECT_EQ(tr, ds.train_docs(7, 0.1));  // same seed, same split
  EXPECT_EQ(va, ds.val_docs(7, 0.1));
  EXPECT_NE(tr, ds.train_docs(8, 0.1));  // another seed shuffles differently
  auto sorted = tr;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(sorted, tr) << "documents must be shuffled";
  // The split is a pure function of (seed, D): what the training loop relies on for resume.
  EXPECT_EQ(sb::shuffled_indices(1000, 3), sb::shuffled_indices(1000, 3));
  EXPECT_EQ(ds.val_docs(7, 0.001).size(), 1u);  // at least one when the fraction is > 0
  EXPECT_EQ(ds.val_docs(7, 0.0).size(), 0u);
  EXPECT_EQ(ds.train_docs(7, 0.0).size(), 101u);
}
