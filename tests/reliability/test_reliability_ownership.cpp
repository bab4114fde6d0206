// Issue 50: nothing a user owns is ever deleted, no input can hang a job, one run owns its
// checkpoint directory, and a damaged HDF5 file the program wrote is refused before libhdf5
// reads it. One test per case of the issue (Case01..Case14), each through the real binary (or
// the io library for the file checks), each checking the message and that every file present
// before is present and unchanged after.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <limits>
#include <map>
#include <set>

#include "io/checkpoint.hpp"
#include "io/file_checksum.hpp"
#include "io/safetensors.hpp"
#include "io/shard.hpp"
#include "reliability_util.hpp"

using namespace rel;

namespace {

std::string g_data, g_ck, g_hf;  // the corpus, a checkpoint `train` wrote, its HF export (f32)

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A model small enough that a run starts and trains a step in well under a second.
std::string flags(const std::string& dir, const std::string& extra = "") {
  return " --set data.path=" + g_data + " --set checkpoint.dir=" + dir + "/ckpt --set log.path=" + dir +
         "/metrics.h5 --set model.n_layers=1 --set model.d_model=16 --set model.n_heads=2 --set model.n_kv_heads=1"
         " --set model.ffn_dim=32 --set train.global_batch_tokens=1024 --set train.micro_batch_tokens=256"
         " --set attention.block_size=16 --set log.progress=false --set balance.self_profile=false"
         " --set checkpoint.every=1 --set train.steps=2" + extra;
}
std::string train(const std::string& dir, const std::string& extra = "") { return binary() + " train" + flags(dir, extra); }
std::string cli(const std::string& args) { return binary() + " " + args; }
std::string in_dir(const std::string& dir, const std::string& cmd) { return "sh -c " + sbtest::sh_quote("cd " + dir + " && " + cmd); }

struct Outcome {
  Exit exit;
  std::string out;
};
// Bounded: a hang is killed after 30 s and fails the test (exit 137), never the suite.
Outcome run_bounded(const std::string& cmd, const std::string& log) {
  fs::remove(log);
  Outcome o{run("timeout -s KILL 30 " + cmd, log), ""};
  o.out = slurp(log);
  return o;
}
void expect_refused(const Outcome& o, const std::vector<std::string>& parts, const std::string& what) {
  EXPECT_EQ(o.exit.code, 1) << what << "\n" << o.out;
  for (const auto& p : parts) EXPECT_TRUE(has(o.out, p)) << what << ": expected '" << p << "'\n" << o.out;
}

// Every entry under `root` (files with their bytes; directories and others by kind).
using Snapshot = std::map<std::string, std::string>;
Snapshot snapshot(const std::string& root) {
  Snapshot s;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const auto st = it->symlink_status();
    const std::string rel = fs::relative(it->path(), root).string();
    s[rel] = fs::is_regular_file(st) ? "file:" + slurp(it->path().string()) : fs::is_directory(st) ? "<dir>" : "<other>";
  }
  return s;
}
// Every entry of `before` is still under `root`, unchanged unless it is one of `replaced`.
void expect_kept(const Snapshot& before, const std::string& root, const std::set<std::string>& replaced = {}) {
  const Snapshot now = snapshot(root);
  for (const auto& [rel, what] : before) {
    auto it = now.find(rel);
    ASSERT_TRUE(it != now.end()) << root << "/" << rel << " is gone";
    if (!replaced.count(rel)) EXPECT_TRUE(it->second == what) << root << "/" << rel << " changed";
  }
}

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}
void copy_dir(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}
std::string config_json(const std::string& dir) { return slurp(dir + "/config.json"); }
// config.json of `dir` with one field's value replaced (the text after "field": up to , or newline).
void set_field(const std::string& dir, const std::string& field, const std::string& value) {
  std::string t = config_json(dir);
  const size_t at = t.find("\"" + field + "\":");
  ASSERT_NE(at, std::string::npos) << field;
  const size_t v = at + field.size() + 3, e = t.find_first_of(",\n", v);
  t.replace(v, e - v, " " + value);
  write(dir + "/config.json", t);
}

}  // namespace

class Issue50 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_data = ensure_corpus("sb_rel_issue50_corpus", "--docs 60 --max-len 256 --min-len 32 --seed 5");
    const std::string dir = (fs::temp_directory_path() / "sb_rel_issue50_corpus").string();
    g_ck = dir + "/ckpt/ckpt_00000002.h5", g_hf = dir + "/hf";
    if (!fs::exists(g_ck)) {
      const Exit e = run(train(dir), dir + "/train.log");
      if (e.code != 0) ADD_FAILURE() << "train failed:\n" << slurp(dir + "/train.log");
    }
    if (!fs::exists(g_hf + "/config.json")) {
      const Exit e = run(cli("convert " + g_ck + " " + g_hf + " --dtype f32"), dir + "/convert.log");
      if (e.code != 0) ADD_FAILURE() << "convert failed:\n" << slurp(dir + "/convert.log");
    }
  }
};

// ---- 1. convert --overwrite writes and replaces its own files, nothing else
TEST_F(Issue50, Case01_ConvertOverwriteReplacesOnlyItsOwnFiles) {
  const std::string dir = scratch("i50_c01"), run_dir = dir + "/run";
  write(run_dir + "/notes.txt", "my notes\n");
  write(run_dir + "/metrics.h5", "a log");
  fs::create_directories(run_dir + "/data");
  fs::copy_file(g_data + "/shard_00000.h5", run_dir + "/data/shard_00000.h5");
  fs::create_directories(run_dir + "/ckpt");
  const std::string src = run_dir + "/ckpt/ckpt_00000002.h5";
  fs::copy_file(g_ck, src);
  const Snapshot before = snapshot(run_dir);
  // DST a parent of SRC, or the directory holding it: refused, nothing touched.
  for (const std::string& dst : {run_dir, run_dir + "/ckpt", run_dir + "/ckpt/"}) {
    auto o = run_bounded(cli("convert " + src + " " + dst + " --overwrite"), dir + "/a.log");
    expect_refused(o, {"holds SRC " + src}, dst);
    expect_kept(before, run_dir);
    EXPECT_EQ(snapshot(run_dir).size(), before.size()) << "files appeared in " << run_dir;
  }
  // DST = SRC: refused.
  expect_refused(run_bounded(cli("convert " + src + " " + src + " --overwrite"), dir + "/b.log"), {src + ": is a file"}, "SRC");
  // An export directory with a user's files: re-export replaces config.json and the weights only.
  const std::string hf = dir + "/hf";
  ASSERT_EQ(run_bounded(cli("convert " + src + " " + hf), dir + "/c.log").exit.code, 0);
  write(hf + "/tokenizer.json", "{\"mine\": true}");
  write(hf + "/README.md", "# my model\n");
  Snapshot hf_before = snapshot(hf);
  auto o = run_bounded(cli("convert " + src + " " + hf + " --overwrite --dtype f32"), dir + "/d.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  expect_kept(hf_before, hf, {"config.json", "model.safetensors"});
  EXPECT_TRUE(has(config_json(hf), "float32"));
  // A previous export with shards: the new single-file export removes the old index and the shards
  // it names (a mix would load the wrong weights), and nothing else.
  const std::string hf2 = dir + "/hf2";
  o = run_bounded(cli("convert " + src + " " + hf2 + " --shard-size 4KB"), dir + "/e.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  ASSERT_TRUE(fs::exists(hf2 + "/model.safetensors.index.json")) << o.out;
  write(hf2 + "/tokenizer.json", "{\"mine\": true}");
  write(hf2 + "/model-00009-of-00009.safetensors", "not named by the index: not the export's");
  hf_before = snapshot(hf2);
  o = run_bounded(cli("convert " + src + " " + hf2 + " --overwrite"), dir + "/f.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "removed the previous export's files")) << o.out;
  for (const auto& [rel, what] : hf_before) {
    const bool own = rel == "config.json" || rel == "model.safetensors.index.json" ||
                     (rel.starts_with("model-") && rel != "model-00009-of-00009.safetensors");
    if (own) continue;
    EXPECT_EQ(snapshot(hf2)[rel], what) << rel;
  }
  EXPECT_FALSE(fs::exists(hf2 + "/model.safetensors.index.json"));
  EXPECT_EQ(sb::SafetensorsDir(hf2).names(), sb::SafetensorsDir(hf).names());
}

// ---- 2. a trailing slash or '.' as DST; a failure leaves everything as it was; import to x.h5/
TEST_F(Issue50, Case02_PathsAreNormalisedAndAFailureChangesNothing) {
  const std::string dir = scratch("i50_c02"), hf_old = dir + "/hf_old";
  ASSERT_EQ(run_bounded(cli("convert " + g_ck + " " + hf_old), dir + "/a.log").exit.code, 0);
  write(hf_old + "/tokenizer.json", "{}");
  Snapshot before = snapshot(hf_old);
  for (const std::string& dst : {hf_old + "/", hf_old + "/.", hf_old + "/../hf_old/"}) {
    auto o = run_bounded(cli("convert " + g_ck + " " + dst + " --overwrite"), dir + "/b.log");
    ASSERT_EQ(o.exit.code, 0) << dst << "\n" << o.out;
    expect_kept(before, hf_old, {"config.json", "model.safetensors"});
    EXPECT_EQ(snapshot(hf_old).size(), before.size()) << dst;  // no temporaries left
  }
  // DST '.': the current directory keeps every file; '.' holding SRC is refused.
  const std::string work = dir + "/work";
  write(work + "/notes.txt", "mine");
  before = snapshot(work);
  auto o = run_bounded(in_dir(work, cli("convert " + g_ck + " . --overwrite")), dir + "/c.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  expect_kept(before, work);
  fs::copy_file(g_ck, work + "/ck.h5");
  before = snapshot(work);
  o = run_bounded(in_dir(work, cli("convert ck.h5 . --overwrite")), dir + "/d.log");
  expect_refused(o, {"holds SRC ck.h5"}, "dot holding SRC");
  expect_kept(before, work);
  // A failure while writing (a directory stands where a temporary goes): everything as it was.
  fs::create_directories(hf_old + "/.model.safetensors.sbtmp");
  before = snapshot(hf_old);
  o = run_bounded(cli("convert " + g_ck + " " + hf_old + " --overwrite --dtype bf16"), dir + "/e.log");
  expect_refused(o, {hf_old + ": export failed, nothing in it changed"}, "failing export");
  expect_kept(before, hf_old);
  EXPECT_EQ(snapshot(hf_old).size(), before.size());
  // Import to x.h5/: refused, no directory made.
  o = run_bounded(cli("convert " + g_hf + " " + dir + "/x.h5/"), dir + "/f.log");
  expect_refused(o, {"DST " + dir + "/x.h5/: names a directory"}, "x.h5/");
  EXPECT_FALSE(fs::exists(dir + "/x.h5"));
}

// ---- 3. one run owns its checkpoint directory
TEST_F(Issue50, Case03_ASecondRunIsRefusedAndAStaleLockNeverBlocks) {
  const std::string dir = scratch("i50_c03"), lock = dir + "/ckpt/.sparsebalance.lock";
  const pid_t first = spawn(train(dir, " --set train.steps=1000000 --set checkpoint.every=0"), dir + "/first.log");
  ASSERT_GT(first, 0);
  for (int i = 0; i < 300 && !has(slurp(lock), "pid="); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(has(slurp(lock), "pid=" + std::to_string(first))) << slurp(dir + "/first.log");
  const Snapshot before = snapshot(dir + "/ckpt");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  auto o = run_bounded(train(dir), dir + "/second.log");
  expect_refused(o, {"checkpoint.dir " + dir + "/ckpt is in use by another run", "host=" + std::string(host),
                     "pid=" + std::to_string(first)}, "second run");
  expect_kept(before, dir + "/ckpt");
  EXPECT_EQ(snapshot(dir + "/ckpt").size(), before.size());
  EXPECT_EQ(kill(first, 0), 0) << "the first run ended";
  // The holder killed: its lock went with it; a requeued run starts, saying whose lock it was.
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  o = run_bounded(train(dir), dir + "/third.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "note: " + lock + " was left by a run that ended without releasing it (host=" +
                             std::string(host) + " pid=" + std::to_string(first))) << o.out;
  EXPECT_EQ(slurp(lock), "") << "a run that ends releases the lock and empties the file";
}

// ---- 4. a FIFO or device where a file is read: refused by name, never a hang
TEST_F(Issue50, Case04_NonRegularInputsAreRefusedNamingTheFile) {
  const std::string dir = scratch("i50_c04");
  auto fifo = [&](const std::string& path) {
    fs::remove(path);
    ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << path;
  };
  std::vector<std::pair<std::string, std::string>> cases;  // command, the file it must name
  for (const char* name : {"config.json", "model.safetensors"}) {
    const std::string d = dir + "/hf_" + name;
    copy_dir(g_hf, d);
    fifo(d + "/" + name);
    cases.push_back({cli("convert " + d + " " + dir + "/o.h5"), d + "/" + name});
    cases.push_back({train(dir + "/t_" + name) + " --init-from " + d, d + "/" + name});
  }
  const std::string sh = dir + "/hf_sharded";
  ASSERT_EQ(run_bounded(cli("convert " + g_ck + " " + sh + " --shard-size 4KB"), dir + "/s.log").exit.code, 0);
  for (const char* name : {"model.safetensors.index.json", "model-00001-of-"}) {
    const std::string d = dir + "/hf_" + std::string(name).substr(0, 10);
    copy_dir(sh, d);
    std::string file = d + "/" + name;
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().filename().string().starts_with(name)) file = e.path().string();
    fifo(file);
    cases.push_back({cli("convert " + d + " " + dir + "/o.h5"), file});
  }
  fifo(dir + "/dict");
  cases.push_back({cli("prep synth --dict " + dir + "/dict --output " + dir + "/p1"), dir + "/dict"});
  write(dir + "/in.txt", "abc abc\n\nbca ab\n");
  fifo(dir + "/tok.json");
  cases.push_back({cli("prep text --input " + dir + "/in.txt --tokenizer " + dir + "/tok.json --output " + dir + "/p2"),
                   dir + "/tok.json"});
  fs::create_directories(dir + "/tok");
  fs::copy_file(std::string(SB_SOURCE_DIR) + "/tests/data/fixtures/bpe_tiny_pairs.json", dir + "/tok/tokenizer.json");
  fifo(dir + "/tok/tokenizer_config.json");
  cases.push_back({cli("prep text --input " + dir + "/in.txt --tokenizer " + dir + "/tok/tokenizer.json --eos '<|end|>' --output " +
                      dir + "/p3"), dir + "/tok/tokenizer_config.json"});
  fifo(dir + "/profile.h5");
  cases.push_back({cli("simulate --profile " + dir + "/profile.h5"), dir + "/profile.h5"});
  cases.push_back({train(dir + "/t_profile", " --set balance.profile=" + dir + "/profile.h5"), dir + "/profile.h5"});
  const std::string zero = dir + "/hf_zero";
  copy_dir(g_hf, zero);
  fs::remove(zero + "/config.json");
  fs::create_symlink("/dev/zero", zero + "/config.json");
  cases.push_back({cli("convert " + zero + " " + dir + "/o.h5"), zero + "/config.json"});  // "(a device)"
  const Snapshot before = snapshot(dir);
  for (size_t i = 0; i < cases.size(); ++i) {
    auto o = run_bounded(cases[i].first, dir + "/run" + std::to_string(i) + ".log");
    EXPECT_NE(o.exit.code, 137) << cases[i].first << ": hung\n" << o.out;
    EXPECT_LT(o.exit.seconds, 10) << cases[i].first;
    expect_refused(o, {cases[i].second + ": not a regular file"}, cases[i].first);
  }
  Snapshot after_ok = before;
  for (size_t i = 0; i < cases.size(); ++i) after_ok.erase("run" + std::to_string(i) + ".log");
  expect_kept(after_ok, dir);
  EXPECT_FALSE(fs::exists(dir + "/o.h5"));
}

// ---- 5. simulate.ranks bounded by what simulate can plan, named before anything is allocated
TEST_F(Issue50, Case05_SimulateRanksAboveWhatCanBePlannedIsRefused) {
  const std::string dir = scratch("i50_c05");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"8192", "simulate.ranks = 8192 x simulate.micro_batches = 16 = 131072 micro-batches per step, more than "
               "simulate plans (at most 65536"},
      {"1048576", "'simulate.ranks' = 1048576 is out of range: expected 1 <= value <= 65536"}};
  for (const auto& [ranks, message] : cases) {
    auto o = run_bounded(cli("simulate --set simulate.steps=1 --set simulate.ranks=" + ranks), dir + "/a.log");
    expect_refused(o, {message}, ranks);
    EXPECT_LT(o.exit.seconds, 5) << o.out;
  }
  EXPECT_EQ(run_bounded(cli("simulate --set simulate.steps=1 --set simulate.ranks=8"), dir + "/b.log").exit.code, 0);
}

// ---- 6. config.json claiming a huge model: the shape error comes before the allocation
TEST_F(Issue50, Case06_ShapesAreCheckedBeforeTheModelIsAllocated) {
  const std::string dir = scratch("i50_c06"), hf = dir + "/hf";
  copy_dir(g_hf, hf);
  set_field(hf, "num_hidden_layers", "1024");
  set_field(hf, "intermediate_size", "1048576");  // ~70 GB of float32 claimed
  const Snapshot before = snapshot(dir);
  auto o = run_bounded("/usr/bin/time -f 'maxrss_kb=%M' " + cli("convert " + hf + " " + dir + "/o.h5"), dir + "/a.log");
  expect_refused(o, {hf + "/model.safetensors: tensor 'model.layers.0.mlp.", "config.json gives [", "1048576"},
                 "huge config.json");
  const size_t at = o.out.find("maxrss_kb=");
  ASSERT_NE(at, std::string::npos) << o.out;
  EXPECT_LT(std::stol(o.out.substr(at + 10)), 400 * 1024) << "allocated before the shapes were checked";
  expect_kept(before, dir, {"a.log"});
  EXPECT_FALSE(fs::exists(dir + "/o.h5"));
}

// ---- 7. integer range messages state the real range and the key
TEST_F(Issue50, Case07_IntegerRangeMessagesStateTheRealRange) {
  const std::string dir = scratch("i50_c07");
  const std::vector<std::tuple<std::string, std::string, std::string>> fields = {
      {"vocab_size", "4294967297", "field 'vocab_size' = 4294967297 is out of range: expected 1 <= value <= 16777216 (the range of model.vocab_size)"},
      {"vocab_size", "20000000", "field 'vocab_size' = 20000000 is out of range: expected 1 <= value <= 16777216"},
      {"hidden_size", "9223372036854775807", "field 'hidden_size' = 9223372036854775807 is out of range: expected 8 <= value <= 65536"},
      {"hidden_size", "18446744073709551615", "field 'hidden_size' = 18446744073709551615 is out of range (above 2^63-1)"}};
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& [field, value, message] = fields[i];
    const std::string hf = dir + "/hf" + std::to_string(i);
    copy_dir(g_hf, hf);
    set_field(hf, field, value);
    const Snapshot before = snapshot(hf);
    expect_refused(run_bounded(cli("convert " + hf + " " + dir + "/o.h5"), dir + "/a.log"), {hf + "/config.json: " + message}, value);
    expect_kept(before, hf);
  }
  auto o = run_bounded(train(dir, " --set train.steps=9223372036854775807"), dir + "/b.log");
  expect_refused(o, {"'train.steps' = 9223372036854775807 is out of range: expected 0 <= value <= 9000000000000000"}, "steps");
}

// ---- 8. an index naming "" or a directory
TEST_F(Issue50, Case08_IndexEntriesMustNameAFile) {
  const std::string dir = scratch("i50_c08"), sh = dir + "/sh";
  ASSERT_EQ(run_bounded(cli("convert " + g_ck + " " + sh + " --shard-size 4KB"), dir + "/s.log").exit.code, 0);
  const std::string index = slurp(sh + "/model.safetensors.index.json");
  const size_t at = index.find("\"model.norm.weight\": \"");
  ASSERT_NE(at, std::string::npos) << index;
  const size_t v = at + std::string("\"model.norm.weight\": \"").size(), e = index.find('"', v);
  for (const std::string& name : {std::string(""), std::string("."), std::string("adir")}) {
    const std::string d = dir + "/case_" + (name.empty() ? "empty" : name == "." ? "dot" : name);
    copy_dir(sh, d);
    std::string t = index;
    t.replace(v, e - v, name);
    write(d + "/model.safetensors.index.json", t);
    if (name == "adir") fs::create_directories(d + "/adir");
    const Snapshot before = snapshot(d);
    auto o = run_bounded(cli("convert " + d + " " + dir + "/o.h5"), dir + "/a.log");
    if (name == "adir")
      expect_refused(o, {d + "/adir: not a regular file (a directory); expected a safetensors file"}, name);
    else
      expect_refused(o, {d + "/model.safetensors.index.json: weight_map entry 'model.norm.weight' is \"" + name +
                         "\", expected the name of a safetensors file in the directory"}, name);
    expect_kept(before, d);
  }
}

// ---- 9. flags whose numbers overflow are refused, not wrapped
TEST_F(Issue50, Case09_OverflowingFlagsAreRefused) {
  const std::string dir = scratch("i50_c09");
  auto o = run_bounded(cli("convert " + g_ck + " " + dir + "/hf --shard-size 99999999999999999999GB"), dir + "/a.log");
  expect_refused(o, {"--shard-size 99999999999999999999GB: expected a size from 1 byte to 1e18 bytes"}, "shard-size");
  EXPECT_FALSE(fs::exists(dir + "/hf"));
  o = run_bounded(cli("convert " + g_ck + " " + dir + "/hf --shard-size 0.1"), dir + "/b.log");
  expect_refused(o, {"--shard-size 0.1: expected a size from 1 byte"}, "shard-size below a byte");
  const Snapshot before = snapshot(g_data);
  for (const char* doc : {"18446744073709551616", "18446744073709551615", "-1"}) {
    o = run_bounded(cli("inspect " + g_data + " --decode " + doc), dir + "/c.log");
    expect_refused(o, {std::string("--decode '") + doc + "': expected a document index (0, 1, ...), an integer from 0 to 9223372036854775807"}, doc);
  }
  o = run_bounded(cli("inspect " + g_data + " --decode 9223372036854775807"), dir + "/d.log");
  expect_refused(o, {"--decode 9223372036854775807: the dataset has 60 documents (0..59)"}, "past the end");
  expect_kept(before, g_data);
}

// ---- 10. a tokenizer id beyond a model's vocabulary: named at load, with tokenizer.json
TEST_F(Issue50, Case10_TokenizerIdsBeyondTheVocabularyAreRefusedAtLoad) {
  const std::string dir = scratch("i50_c10");
  std::string t = slurp(std::string(SB_SOURCE_DIR) + "/tests/data/fixtures/bpe_tiny_pairs.json");
  t.replace(t.find("\"bc\": 7"), 7, "\"bc\": 20000000");
  write(dir + "/tokenizer.json", t);
  write(dir + "/in.txt", "abc abc\n\nbca ab\n");
  fs::create_directories(dir + "/out");
  write(dir + "/out/keep.txt", "mine");
  const Snapshot before = snapshot(dir);
  auto o = run_bounded(cli("prep text --input " + dir + "/in.txt --tokenizer " + dir + "/tokenizer.json --eos '<|end|>' --output " +
                          dir + "/out --overwrite"), dir + "/a.log");
  expect_refused(o, {dir + "/tokenizer.json: model.vocab[\"bc\"]: id 20000000 is beyond what a model vocabulary holds: ids must be < 16777216 (model.vocab_size"}, "id");
  EXPECT_FALSE(has(o.out, "staging")) << o.out;
  expect_kept(before, dir, {"a.log"});
  EXPECT_EQ(snapshot(dir + "/out").size(), 1u);
}

// ---- 11. a micro-batch smaller than an attention block: both keys named
TEST_F(Issue50, Case11_MicroBatchBelowTheBlockSizeNamesBothKeys) {
  const std::string dir = scratch("i50_c11");
  auto o = run_bounded(train(dir, " --set train.micro_batch_tokens=16 --set attention.block_size=32 --set balance.self_profile=true"),
                       dir + "/a.log");
  expect_refused(o, {"train.micro_batch_tokens = 16 is below attention.block_size = 32"}, "micro-batch");
  EXPECT_FALSE(fs::exists(dir + "/ckpt/ckpt_00000001.h5"));
}

// ---- 12. a resume after changing attention.block_size: the advice names the real cause
TEST_F(Issue50, Case12_ResumeAfterABlockSizeChangeNamesTheStoredModel) {
  const std::string dir = scratch("i50_c12");
  ASSERT_EQ(run_bounded(train(dir), dir + "/a.log").exit.code, 0) << slurp(dir + "/a.log");
  const Snapshot before = snapshot(dir + "/ckpt");
  auto o = run_bounded(train(dir, " --set train.steps=4 --set attention.block_size=32") + " --resume " + dir +
                       "/ckpt/ckpt_00000002.h5", dir + "/b.log");
  expect_refused(o, {"the latency model stored in this checkpoint was measured for block_size = 16 but this run has 32 "
                     "(attention.block_size)", "set attention.block_size = 16 again", "--init-from"}, "resume");
  EXPECT_FALSE(has(o.out, "balance.profile")) << o.out;
  expect_kept(before, dir + "/ckpt");
}

// ---- 13. NaN/inf weights: refused at import naming the tensor, or a warning when asked
TEST_F(Issue50, Case13_NonFiniteWeightsAreNamedAtImport) {
  const std::string dir = scratch("i50_c13"), hf = dir + "/hf";
  copy_dir(g_hf, hf);
  {  // a NaN in model.norm.weight's third value (float32)
    uint64_t header = 0;
    std::uint64_t begin = 0;
    {
      sb::SafetensorsFile f(hf + "/model.safetensors");
      begin = f.find("model.norm.weight")->begin;
      std::ifstream in(hf + "/model.safetensors", std::ios::binary);
      in.read(reinterpret_cast<char*>(&header), 8);
    }
    std::fstream io(hf + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(std::streamoff(8 + header + begin + 8));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    io.write(reinterpret_cast<const char*>(&nan), 4);
  }
  const Snapshot before = snapshot(hf);
  auto o = run_bounded(cli("convert " + hf + " " + dir + "/o.h5"), dir + "/a.log");
  expect_refused(o, {hf + "/model.safetensors: tensor 'model.norm.weight' holds 1 non-finite value(s) (NaN or inf; the first at flat index 2",
                     "convert --nonfinite warn"}, "nan");
  EXPECT_FALSE(fs::exists(dir + "/o.h5"));
  o = run_bounded(train(dir) + " --init-from " + hf, dir + "/b.log");
  expect_refused(o, {"tensor 'model.norm.weight' holds 1 non-finite value(s)"}, "init-from");
  o = run_bounded(cli("convert " + hf + " " + dir + "/o.h5 --nonfinite warn"), dir + "/c.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "warning: " + hf + "/model.safetensors: tensor 'model.norm.weight' holds 1 non-finite value(s)")) << o.out;
  expect_kept(before, hf);
}

// ---- 14. a damaged shard or checkpoint the program wrote is refused before libhdf5 reads it
TEST_F(Issue50, Case14_AFlippedBitAnywhereIsRefusedNamingTheFile) {
  const std::string dir = scratch("i50_c14");
  const std::string shard = g_data + "/shard_00000.h5";
  EXPECT_EQ(sb::verify_file_checksum(g_ck), sb::FileChecksum::Verified);
  EXPECT_EQ(sb::verify_file_checksum(shard), sb::FileChecksum::Verified);
  for (const std::string& src : {g_ck, shard}) {
    const uint64_t size = fs::file_size(src);
    std::vector<uint64_t> at = {0, 5, 9, 17, 25, 40, 511, 512, 520, 600, 1000, size / 3, size / 2, size - 9, size - 1};
    for (uint64_t k = 1; k < 24; ++k) at.push_back(size * k / 24 + 3);
    for (uint64_t pos : at) {
      for (int bit : {0, 7}) {
        const std::string p = dir + "/d_" + std::to_string(pos) + "_" + std::to_string(bit) + ".h5";
        fs::copy_file(src, p, fs::copy_options::overwrite_existing);
        {
          std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
          io.seekg(std::streamoff(pos));
          char c = 0;
          io.read(&c, 1);
          c = char(c ^ (1 << bit));
          io.seekp(std::streamoff(pos));
          io.write(&c, 1);
        }
        const std::string msg = error_of([&] {
          if (src == g_ck) sb::read_checkpoint(p);
          else sb::ShardReader::open(p);
        });
        EXPECT_TRUE(has(msg, p + ": damaged")) << "byte " << pos << " bit " << bit << " of " << src << ": " << msg;
        fs::remove(p);
      }
    }
  }
  // Through the binary: named, exit 1.
  const std::string bad = dir + "/data/shard_00000.h5";
  fs::create_directories(dir + "/data");
  fs::copy_file(shard, bad);
  {
    std::fstream io(bad, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = std::streamoff(fs::file_size(shard) / 2);
    char c = 0;
    io.seekg(at), io.read(&c, 1), io.seekp(at), io.put(char(c ^ 0x5a));
  }
  for (const std::string& cmd : {cli("inspect " + bad), train(dir, " --set data.path=" + dir + "/data")}) {
    auto o = run_bounded(cmd, dir + "/a.log");
    expect_refused(o, {bad + ": damaged: whole-file checksum mismatch"}, cmd);
  }
  // A file without the block (written before it existed, or by another tool) takes the old path:
  // the same checkpoint with its user block cut off is a valid HDF5 file and reads as before.
  const std::string old = dir + "/old.h5";
  {
    std::string bytes = slurp(g_ck);
    write(old, bytes.substr(sb::kChecksumBlock));
  }
  EXPECT_EQ(sb::verify_file_checksum(old), sb::FileChecksum::Absent);
  EXPECT_EQ(sb::read_checkpoint(old).params, sb::read_checkpoint(g_ck).params);
  // The sliced writer (train.zero = 1, every rank writes its slice; rank 0 stamps after all closed).
  auto o = run_bounded(mpirun(2) + train(dir + "/zero", " --set train.zero=1 --set train.steps=1"), dir + "/z.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_EQ(sb::verify_file_checksum(dir + "/zero/ckpt/ckpt_00000001.h5"), sb::FileChecksum::Verified);
}

// The checksum is XXH64: the reference library's values (libxxhash 0.8.1, XXH64(data, n, 0)),
// whole and streamed in uneven pieces (the file reader hashes 4 MiB pieces).
TEST(Issue50Checksum, Xxh64MatchesTheReference) {
  std::string all;
  for (int r = 0; r < 5; ++r)
    for (int i = 0; i < 256; ++i) all += char(i);
  const std::vector<std::pair<std::string, uint64_t>> ref = {
      {"", 0xef46db3751d8e999ull}, {"abc", 0x44bc2cf5ad770999ull}, {all, 0xafc184ad7938a354ull},
      {std::string(31, 'a'), 0xfe47067cda802916ull}, {std::string(33, 'b'), 0x5c6c1f545d334f3aull}};
  for (const auto& [data, want] : ref) {
    EXPECT_EQ(sb::xxh64(data.data(), data.size()), want) << data.size() << " bytes";
    for (size_t piece : {1, 7, 32, 33, 100}) {
      sb::Xxh64 h;
      for (size_t at = 0; at < data.size(); at += piece) h.update(data.data() + at, std::min(piece, data.size() - at));
      EXPECT_EQ(h.digest(), want) << data.size() << " bytes in pieces of " << piece;
    }
  }
}
