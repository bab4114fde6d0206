// Config loading, overrides and validation errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "src/cli/args.hpp"
#include "base/error.hpp"
#include "src/config/config.hpp"
#include "tests/error_of.hpp"

using sbtest::error_of;

using sb::Config;

namespace {
std::string write_tmp(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p.string();
}
}  // namespace

TEST(Config, DefaultsAndFileAndOverrides) {
  auto path = write_tmp("sb_cfg_ok.toml", "[model]\nn_layers = 3\n[train]\nlr = 1\n[attention]\nmode = \"dense\"\n");
  std::vector<std::string> sets = {"train.steps=7", "model.tie_embeddings=false", "attention.mode=sparse"};
  Config c = Config::load(path, sets);
  EXPECT_EQ(c.i("model.n_layers"), 3);
  EXPECT_DOUBLE_EQ(c.f("train.lr"), 1.0);  // integer accepted for a float key
  EXPECT_EQ(c.i("train.steps"), 7);
  EXPECT_FALSE(c.b("model.tie_embeddings"));
  EXPECT_EQ(c.s("attention.mode"), "sparse");  // override wins over the file
  EXPECT_EQ(c.i("model.d_model"), Config().i("model.d_model"));
  // The effective config round-trips through its TOML text (as stored in checkpoints).
  Config back = Config::from_text(c.to_toml(), "roundtrip");
  EXPECT_EQ(back.to_toml(), c.to_toml());
  EXPECT_EQ(back.i("train.steps"), 7);
}

// Issue 49 renamed the context-parallel "shard" (keys and a value): a config or a checkpoint's stored
// config written with the former names reads as the new ones, in a file and with --set.
TEST(Config, FormerNamesReadAsTheCurrentOnes) {
  auto path = write_tmp("sb_cfg_old.toml", "[data]\nlong_docs = \"shard\"\n[balance]\nshard_docs = true\nshard_part = 0.25\n"
                                          "[attention]\nshard_exchange = \"selective\"\n");
  std::vector<std::string> sets = {"simulate.long_docs=shard"};
  Config c = Config::load(path, sets);
  EXPECT_EQ(c.s("data.long_docs"), "split");
  EXPECT_EQ(c.s("simulate.long_docs"), "split");
  EXPECT_TRUE(c.b("balance.split_docs"));
  EXPECT_DOUBLE_EQ(c.f("balance.part_share"), 0.25);
  EXPECT_EQ(c.s("attention.part_exchange"), "selective");
  // stored under the current names only ("shard" stays the token file's word: prep.shard_tokens)
  for (const char* former : {"shard_docs", "shard_part", "shard_exchange", "\"shard\""})
    EXPECT_EQ(c.to_toml().find(former), std::string::npos) << former;
  EXPECT_EQ(Config::load("", std::vector<std::string>{"balance.shard_part=0.5"}).f("balance.part_share"), 0.5);
  // other values are still checked against the choices
  EXPECT_NE(error_of([] { Config::load("", std::vector<std::string>{"data.long_docs=shards"}); }).find("expected one of window, reject, split"),
            std::string::npos);
}

TEST(Config, UnknownKeySuggestsNearest) {
  auto path = write_tmp("sb_cfg_typo.toml", "[model]\nn_layer = 3\n");
  auto msg = error_of([&] { Config::load(path); });
  EXPECT_NE(msg.find("sb_cfg_typo.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'model.n_layer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'model.n_layers'"), std::string::npos) << msg;
  std::vector<std::string> sets = {"train.block_size=64"};
  msg = error_of([&] { Config::load("", sets); });
  EXPECT_NE(msg.find("--set train.block_size=64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("attention.block_size"), std::string::npos) << msg;
}

TEST(Config, WrongTypeAndRange) {
  auto path = write_tmp("sb_cfg_type.toml", "[model]\nn_heads = \"4\"\n");
  auto msg = error_of([&] { Config::load(path); });
  EXPECT_NE(msg.find("'model.n_heads' must be an integer, got a string"), std::string::npos) << msg;
  std::vector<std::string> neg = {"train.lr=-1"};
  msg = error_of([&] { Config::load("", neg); });
  EXPECT_NE(msg.find("'train.lr' = -1 is out of range"), std::string::npos) << msg;
  std::vector<std::string> huge = {"model.n_layers=1000000"};
  msg = error_of([&] { Config::load("", huge); });
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  std::vector<std::string> choice = {"attention.mode=fast"};
  msg = error_of([&] { Config::load("", choice); });
  EXPECT_NE(msg.find("expected one of dense, sparse"), std::string::npos) << msg;
  std::vector<std::string> notnum = {"train.steps=ten"};
  msg = error_of([&] { Config::load("", notnum); });
  EXPECT_NE(msg.find("'train.steps' must be an integer, got 'ten'"), std::string::npos) << msg;
  std::vector<std::string> noeq = {"train.steps"};
  msg = error_of([&] { Config::load("", noeq); });
  EXPECT_NE(msg.find("expected key=value"), std::string::npos) << msg;
}

// Found by fuzz_config: a `--set` string with a stray byte (not UTF-8) was accepted, then written
// into the checkpoint's TOML as a different text. Strings must be UTF-8 without control bytes.
TEST(Config, StringsMustBeUtf8Text) {
  std::vector<std::string> stray = {std::string("data.path=ab\xc7" "cd")};
  auto msg = error_of([&] { Config::load("", stray); });
  EXPECT_NE(msg.find("--set data.path"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must be UTF-8 text without control characters; byte 2"), std::string::npos) << msg;
  std::vector<std::string> nul = {std::string("data.path=a\0b", 13)};
  msg = error_of([&] { Config::load("", nul); });  // the NUL shown escaped, not ending the message
  EXPECT_NE(msg.find("--set data.path=a\\x00b: 'data.path' must be UTF-8 text"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte 1 is not"), std::string::npos) << msg;
  auto path = write_tmp("sb_cfg_nul.toml", "[data]\npath = \"x\\u0000y\"\n");
  msg = error_of([&] { Config::load(path); });
  EXPECT_NE(msg.find("sb_cfg_nul.toml: 'data.path' must be UTF-8 text"), std::string::npos) << msg;
  std::vector<std::string> ok = {"data.path=d\xc3\xa9j\xc3\xa0-vu"};  // déjà-vu
  EXPECT_EQ(Config::load("", ok).s("data.path"), "d\xc3\xa9j\xc3\xa0-vu");
  // Integers are decimal: a leading zero does not switch to octal.
  std::vector<std::string> lead = {"train.steps=010"};
  EXPECT_EQ(Config::load("", lead).i("train.steps"), 10);
}

TEST(Config, BadTomlAndMissingFile) {
  auto path = write_tmp("sb_cfg_bad.toml", "[model\nn_layers = 3\n");
  auto msg = error_of([&] { Config::load(path); });
  EXPECT_NE(msg.find("sb_cfg_bad.toml:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid TOML"), std::string::npos) << msg;
  msg = error_of([&] { Config::load("/nonexistent/x.toml"); });
  EXPECT_NE(msg.find("/nonexistent/x.toml: cannot open"), std::string::npos) << msg;
}

// data.sources: a list of { path, weight } tables, from a file or --set; each bad value is named.
TEST(Config, SourcesParseRoundTripAndRefuseBadValues) {
  auto path = write_tmp("sb_cfg_sources.toml", "[data]\nsources = [{ path = \"a\", weight = 3 }, { path = \"b\", weight = 0.5 }]\n");
  Config c = Config::load(path, {});
  auto src = c.sources("data.sources");
  ASSERT_EQ(src.size(), 2u);
  EXPECT_EQ(src[0].path, "a");
  EXPECT_DOUBLE_EQ(src[0].weight, 3.0);  // an integer weight is accepted
  EXPECT_EQ(src[1].path, "b");
  EXPECT_DOUBLE_EQ(src[1].weight, 0.5);
  EXPECT_TRUE(c.given("data.sources"));
  EXPECT_FALSE(c.given("data.path"));
  EXPECT_TRUE(Config().sources("data.sources").empty());  // the default: no mixture
  // The stored config (checkpoints) holds the list and no data.path, and reads back the same.
  const std::string toml = c.to_toml();
  EXPECT_EQ(toml.find("path = 'runs/tiny/data'"), std::string::npos) << toml;
  EXPECT_NE(toml.find("sources = [ { path = 'a', weight = 3.0 }"), std::string::npos) << toml;
  Config back = Config::from_text(toml, "roundtrip");
  EXPECT_EQ(back.to_toml(), toml);
  ASSERT_EQ(back.sources("data.sources").size(), 2u);
  EXPECT_EQ(back.sources("data.sources")[1].path, "b");
  // --set takes the list in TOML syntax.
  std::vector<std::string> sets = {"data.sources=[{ path = \"x\", weight = 1 }]"};
  EXPECT_EQ(Config::load("", sets).sources("data.sources")[0].path, "x");
  // A --set of one of data.path / data.sources replaces the other given by the file (or a stored config).
  Config over = Config::load(path, std::vector<std::string>{"data.path=d"});
  EXPECT_TRUE(over.given("data.path"));
  EXPECT_FALSE(over.given("data.sources"));
  EXPECT_TRUE(over.sources("data.sources").empty());
  Config back2 = Config::from_text(over.to_toml(), "stored");  // every key of a data.path run's config
  EXPECT_TRUE(back2.given("data.path"));
  back2.set("data.sources", "[{ path = \"y\", weight = 1 }]", "--set");
  EXPECT_FALSE(back2.given("data.path"));
  EXPECT_EQ(back2.sources("data.sources")[0].path, "y");
  Config two = Config::load("", std::vector<std::string>{"data.path=d", "data.sources=[{ path = \"y\", weight = 1 }]"});
  EXPECT_TRUE(two.given("data.path") && two.given("data.sources"));  // two --sets: both (settings refuses that)

  auto bad = [](const std::string& value) {
    return error_of([&] { Config().set("data.sources", value, "--set data.sources"); });
  };
  const auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };
  std::string m = bad("[{ path = \"a\", weight = 0 }]");
  EXPECT_TRUE(has(m, "'data.sources[0].weight' must be a positive finite number, got 0")) << m;
  m = bad("[{ path = \"a\", weight = 1 }, { path = \"b\", weight = -2 }]");
  EXPECT_TRUE(has(m, "'data.sources[1].weight' must be a positive finite number, got -2")) << m;
  m = bad("[{ path = \"a\", weight = inf }]");
  EXPECT_TRUE(has(m, "'data.sources[0].weight' must be a positive finite number, got inf")) << m;
  m = bad("[{ path = \"a\", weight = nan }]");
  EXPECT_TRUE(has(m, "'data.sources[0].weight' must be a positive finite number")) << m;
  m = bad("[{ path = \"a\" }]");
  EXPECT_TRUE(has(m, "'data.sources[0].weight' must be a positive finite number, got nothing")) << m;
  m = bad("[{ path = \"a\", weight = \"1\" }]");
  EXPECT_TRUE(has(m, "'data.sources[0].weight' must be a positive finite number, got a string")) << m;
  m = bad("[{ weight = 1 }]");
  EXPECT_TRUE(has(m, "'data.sources[0].path' is missing")) << m;
  m = bad("[{ path = \"\", weight = 1 }]");
  EXPECT_TRUE(has(m, "'data.sources[0].path' must be a non-empty string")) << m;
  m = bad("[{ path = \"a\", weight = 1, wieght = 2 }]");
  EXPECT_TRUE(has(m, "'data.sources[0].wieght' is not a key of a source")) << m;
  m = bad("[]");
  EXPECT_TRUE(has(m, "'data.sources' is an empty list")) << m;
  m = bad("\"a\"");
  EXPECT_TRUE(has(m, "'data.sources' must be a list")) << m;
  m = bad("[\"a\"]");
  EXPECT_TRUE(has(m, "'data.sources[0]' must be a table")) << m;
  m = bad("[{ path = ");
  EXPECT_TRUE(has(m, "'data.sources' must be a list of { path")) << m;
  // From a file, the message names the file.
  auto file = write_tmp("sb_cfg_sources_bad.toml", "[data]\nsources = [{ path = \"a\", weight = -1 }]\n");
  m = error_of([&] { Config::load(file, {}); });
  EXPECT_TRUE(has(m, "sb_cfg_sources_bad.toml") && has(m, "'data.sources[0].weight'")) << m;
}

TEST(Args, FlagsAndSets) {
  std::vector<sb::FlagSpec> flags = {{"input", -1, "inputs"}, {"output", 1, "out"}, {"json", 0, "json"}};
  const char* argv[] = {"cfg.toml", "--input", "a", "b", "--output=o", "--set", "train.steps=3", "--json"};
  auto a = sb::parse_args(std::span<char* const>(const_cast<char**>(argv), 8), flags, "sparsebalance x");
  EXPECT_EQ(a.positional, std::vector<std::string>{"cfg.toml"});
  EXPECT_EQ(a.all("input"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a.get("output"), "o");
  EXPECT_EQ(a.sets, std::vector<std::string>{"train.steps=3"});
  EXPECT_TRUE(a.has("json"));
  const char* bad[] = {"--ouptut", "x"};
  auto msg = error_of([&] { sb::parse_args(std::span<char* const>(const_cast<char**>(bad), 2), flags, "sparsebalance x"); });
  EXPECT_NE(msg.find("unknown flag --ouptut; did you mean --output?"), std::string::npos) << msg;
}
