// Issue 7, item 5: corrupt and hostile inputs are rejected with a message naming the file and the
// field, never a crash: checkpoints (truncated at many sizes, wrong dtype, wrong shape, missing
// dataset, flipped bytes -> checksum), shards truncated at many sizes, hostile configs.
#include <gtest/gtest.h>

#include <vector>

#include "io/checkpoint.hpp"
#include "io/shard.hpp"
#include "reliability_util.hpp"
#include "tests/restamp.hpp"
#include "src/config/config.hpp"

using namespace rel;

namespace {

sb::Checkpoint small_checkpoint() {
  sb::Checkpoint ck;
  ck.step = 5, ck.ranks = 2, ck.data_cursor = 11;
  ck.config_toml = "[train]\nsteps = 9\n";
  size_t off = 0;
  for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"model.embed_tokens.weight", {64, 16}}, {"model.norm.weight", {16}}, {"lm_head.weight", {8, 16}}}) {
    size_t n = 1;
    for (auto s : shape) n *= size_t(s);
    ck.tensors.push_back({name, shape, off, n});
    off += n;
  }
  for (size_t i = 0; i < off; ++i)
    ck.params.push_back(0.001f * float(i)), ck.m.push_back(1e-3f * float(i % 7)), ck.v.push_back(1e-6f);
  return ck;
}

std::string write_good(const std::string& dir, const std::string& name) {
  std::string p = dir + "/" + name;
  sb::write_checkpoint(p, small_checkpoint());
  return p;
}

void replace_dataset(const std::string& file, const std::string& name, hid_t type, std::vector<hsize_t> dims) {
  sb::h5::Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0);
  size_t n = 1;
  for (auto d : dims) n *= d;
  std::vector<double> zeros(n, 0.0);
  sb::h5::Id space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  sb::h5::Id ds(H5Dcreate2(f, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(ds.valid());
  if (H5Tequal(type, H5T_NATIVE_DOUBLE) > 0) H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data());
  ds.reset(), space.reset(), f.reset();
  sbtest::restamp(file);
}

#define EXPECT_NAMES(msg, a, b)                                                          \
  do {                                                                                   \
    EXPECT_NE((msg).find(a), std::string::npos) << "message lacks '" << (a) << "': " << (msg); \
    EXPECT_NE((msg).find(b), std::string::npos) << "message lacks '" << (b) << "': " << (msg); \
  } while (0)

}  // namespace

TEST(CheckpointInputs, GoodOneReads) {
  auto dir = scratch("ck_good");
  auto ck = sb::read_checkpoint(write_good(dir, "good.h5"));
  EXPECT_EQ(ck.step, 5);
  EXPECT_EQ(ck.params, small_checkpoint().params);
}

TEST(CheckpointInputs, TruncatedAtManySizesIsAnErrorNamingTheFile) {
  auto dir = scratch("ck_trunc");
  auto good = write_good(dir, "good.h5");
  const auto full = fs::file_size(good);
  std::vector<uintmax_t> sizes = {0, 1, 7, 8, 64, 96, 512, 1024, 2048, full - 1, full - 8, full - 100};
  for (int i = 1; i < 40; ++i) sizes.push_back(full * uintmax_t(i) / 40);
  int n = 0;
  for (auto sz : sizes) {
    if (sz >= full) continue;
    std::string p = dir + "/t_" + std::to_string(sz) + ".h5";
    fs::copy_file(good, p, fs::copy_options::overwrite_existing);
    fs::resize_file(p, sz);
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_FALSE(msg.empty()) << "truncated to " << sz << " of " << full << " bytes was accepted";
    EXPECT_EQ(msg.find("NOT AN sb::Error"), std::string::npos) << msg;
    EXPECT_NE(msg.find(p), std::string::npos) << "size " << sz << ": " << msg;
    ++n;
  }
  EXPECT_GE(n, 40);
}

TEST(CheckpointInputs, FlippedByteInAParamIsAChecksumMismatch) {
  auto dir = scratch("ck_flip");
  for (const char* ds : {"params/model.norm.weight", "optim/m/lm_head.weight", "optim/v/model.embed_tokens.weight"}) {
    auto p = write_good(dir, "flip.h5");
    flip_dataset_byte(p, ds, 5);
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "checksum mismatch");
  }
}

TEST(CheckpointInputs, WrongDtypeShapeAndMissingDatasetNameTheField) {
  auto dir = scratch("ck_fields");
  {
    auto p = write_good(dir, "dtype.h5");
    replace_dataset(p, "params/model.norm.weight", H5T_NATIVE_DOUBLE, {16});
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "params/model.norm.weight");
  }
  {
    auto p = write_good(dir, "dtype_int.h5");
    replace_dataset(p, "optim/m/model.norm.weight", H5T_NATIVE_INT32, {16});
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "optim/m/model.norm.weight");
  }
  {
    auto p = write_good(dir, "shape.h5");  // a moment with a different element count than its param
    replace_dataset(p, "optim/v/lm_head.weight", H5T_NATIVE_FLOAT, {8, 15});
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "optim/v/lm_head.weight");
  }
  {
    auto p = write_good(dir, "count.h5");  // param and moments agree, the count attribute does not
    for (const char* g : {"params/", "optim/m/", "optim/v/"})
      replace_dataset(p, std::string(g) + "model.norm.weight", H5T_NATIVE_FLOAT, {15});
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "num_params");
  }
  {
    auto p = write_good(dir, "missing.h5");
    {
      sb::h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      ASSERT_GE(H5Ldelete(f, "optim/v/model.norm.weight", H5P_DEFAULT), 0);
    }
    sbtest::restamp(p);
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "optim/v/model.norm.weight");
  }
  {
    auto p = write_good(dir, "noconfig.h5");
    {
      sb::h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      ASSERT_GE(H5Ldelete(f, "config", H5P_DEFAULT), 0);
    }
    sbtest::restamp(p);
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "'config'");
  }
  {
    auto p = write_good(dir, "attr.h5");
    {
      sb::h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      ASSERT_GE(H5Adelete(f, "step"), 0);
      sb::h5::write_attr(f, "step", std::string("five"));
    }
    sbtest::restamp(p);
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "'step'");
  }
  {  // another SparseBalance file, or a newer checkpoint version (h5::check_format)
    auto p = write_good(dir, "format.h5");
    {
      sb::h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      ASSERT_GE(H5Adelete(f, "format"), 0);
      sb::h5::write_attr(f, "format", std::string("sparsebalance-shard"));
    }
    sbtest::restamp(p);
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "attribute 'format' is \"sparsebalance-shard\", expected \"sparsebalance-checkpoint\" (not a checkpoint)");
    p = write_good(dir, "version.h5");
    {
      sb::h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      ASSERT_GE(H5Adelete(f, "version"), 0);
      sb::h5::write_attr(f, "version", int64_t(7));
    }
    sbtest::restamp(p);
    msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NAMES(msg, p, "attribute 'version' is 7, expected 1");
  }
  {
    auto p = write_good(dir, "notack.h5");
    fs::resize_file(p, 0);
    std::ofstream(p) << "this is not an HDF5 file at all\n";
    auto msg = error_of([&] { sb::read_checkpoint(p); });
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_EQ(msg.find("NOT AN sb::Error"), std::string::npos) << msg;
  }
}

TEST(ShardInputs, TruncatedAtManySizesIsAnErrorNamingTheFile) {
  auto dir = scratch("shard_trunc");
  std::string good = dir + "/good.h5";
  {
    sb::ShardWriter w(good, {259, "byte", 257});
    std::vector<uint32_t> doc(3000, 65);
    for (int i = 0; i < 5; ++i) w.add(doc, sb::TaskSpan{1, 2, 9});
    w.close();
  }
  const auto full = fs::file_size(good);
  std::vector<uintmax_t> sizes = {0, 1, 8, 100, 1000, 4096, full - 1};
  for (int i = 1; i < 30; ++i) sizes.push_back(full * uintmax_t(i) / 30);
  for (auto sz : sizes) {
    std::string sub = dir + "/s" + std::to_string(sz);
    fs::create_directories(sub);
    std::string p = sub + "/shard.h5";
    fs::copy_file(good, p, fs::copy_options::overwrite_existing);
    fs::resize_file(p, sz);
    auto msg = error_of([&] {
      auto ds = sb::Dataset::open(sub);
      for (uint64_t d = 0; d < ds.num_docs(); ++d) ds.read_doc(d);
      ds.verify();
    });
    EXPECT_FALSE(msg.empty()) << "truncated to " << sz << " of " << full << " accepted";
    EXPECT_EQ(msg.find("NOT AN sb::Error"), std::string::npos) << msg;
    EXPECT_NE(msg.find(p), std::string::npos) << "size " << sz << ": " << msg;
  }
}

TEST(ConfigInputs, HostileValuesNameTheOriginAndKey) {
  struct Case { std::string toml, key, expect; };
  std::vector<Case> files = {
      {"[train]\nsteps = \"ten\"\n", "train.steps", "integer"},
      {"[train]\nsteps = -1\n", "train.steps", "out of range"},
      {"[train]\nsteps = 1.5\n", "train.steps", "integer"},
      {"[train]\nsteps = 99999999999999999999\n", "", ""},  // TOML itself rejects the overflow
      {"[train]\nlr = nan\n", "train.lr", ""},
      {"[train]\nlr = inf\n", "train.lr", ""},
      {"[train]\nlr = 1e300\n", "train.lr", "out of range"},
      {"[model]\nd_model = 9223372036854775807\n", "model.d_model", "out of range"},
      {"[checkpoint]\nkeep = 0\n", "checkpoint.keep", "out of range"},
      {"[train]\nstepz = 3\n", "train.stepz", "train.steps"},
      {"[nosuch]\nx = 1\n", "nosuch", ""},
      {"[train]\nsteps = [1, 2]\n", "train.steps", ""},
      {"[train]\nsteps = { a = 1 }\n", "train.steps", ""},
      {"[train.steps]\nx = 1\n", "train.steps", ""},
      {"train = 5\n", "train", ""},
      {"[log]\nprogress = \"yes\"\n", "log.progress", ""},
      {"[train]\nnonfinite = \"ignore\"\n", "train.nonfinite", "skip"},
      {"[train]\ninject_nan_step = -3\n", "train.inject_nan_step", "out of range"},
      {"[train]\nsteps = 1\nsteps = 2\n", "", ""},
      {std::string("[train]\nsteps = 1\x00\x01\n", 20), "", ""},
  };
  for (const auto& c : files) {
    auto msg = error_of([&] { sb::Config::from_text(c.toml, "hostile.toml"); });
    EXPECT_FALSE(msg.empty()) << "accepted: " << c.toml;
    EXPECT_EQ(msg.find("NOT AN sb::Error"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hostile.toml"), std::string::npos) << msg;
    if (!c.key.empty()) {
      EXPECT_NE(msg.find(c.key), std::string::npos) << c.toml << " -> " << msg;
    }
    if (!c.expect.empty()) {
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.toml << " -> " << msg;
    }
  }
  std::vector<std::pair<std::string, std::string>> sets = {
      {"train.steps=-5", "train.steps"},           {"train.steps=1e99", "train.steps"},
      {"train.steps=18446744073709551616", "train.steps"}, {"train.lr=abc", "train.lr"},
      {"train.lr=nan", "train.lr"},                {"train.lr=inf", "train.lr"},
      {"model.tie_embeddings=2", "model.tie_embeddings"}, {"nosuch.key=1", "nosuch.key"},
      {"=5", "key=value"},                         {"train.steps", "key=value"},
      {"train.steps= 5x", "train.steps"},          {"train.inject_nan_count=0", "train.inject_nan_count"},
  };
  for (const auto& [ov, key] : sets) {
    std::vector<std::string> v{ov};
    auto msg = error_of([&] { sb::Config::load("", v); });
    EXPECT_FALSE(msg.empty()) << "accepted: --set " << ov;
    EXPECT_EQ(msg.find("NOT AN sb::Error"), std::string::npos) << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << ov << " -> " << msg;
    EXPECT_NE(msg.find("--set"), std::string::npos) << ov << " -> " << msg;
  }
}
