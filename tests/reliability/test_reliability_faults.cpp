// Issue 24: faults that hung a job or lost data, through the real binary.
//  1. an error on one rank (injected in every phase of the step, or a real one: a bad token id,
//     an unusable log.path) ends the whole job within seconds, the message on stderr, at 2 and 4
//     ranks, the failing rank a non-zero one too;
//  2. resume from an older checkpoint: the newer ones and their log rows are archived, not mixed
//     or deleted; a moved-aside log is never overwritten;
//  3. prep --overwrite keeps the old shards until the new set is complete;
//  4. hostile inputs (vocab sizes, NaN in the checkpoint's models, FIFOs, directories, flags)
//     are errors naming what is at fault.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/metrics_log.hpp"
#include "io/shard.hpp"
#include "src/config/config.hpp"
#include "reliability_util.hpp"
#include "tests/restamp.hpp"

using namespace rel;

namespace {

std::string g_data;

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A model small enough that a 4-rank job starts and runs a step in well under a second.
std::string flags(const std::string& dir, const std::string& extra = "") {
  return " --set data.path=" + g_data + " --set checkpoint.dir=" + dir + "/ckpt --set log.path=" + dir +
         "/metrics.h5 --set model.n_layers=1 --set model.d_model=16 --set model.n_heads=2 --set model.n_kv_heads=1"
         " --set model.ffn_dim=32 --set train.global_batch_tokens=1024 --set train.micro_batch_tokens=256"
         " --set attention.block_size=16 --set log.progress=false --set balance.self_profile=false"
         " --set checkpoint.every=1 --set train.steps=3" + extra;
}

std::string train(const std::string& dir, const std::string& extra = "") { return binary() + " train" + flags(dir, extra); }

// Runs under `timeout` (a hang fails the test instead of the suite) and returns the output.
struct Outcome {
  Exit exit;
  std::string out;
};
Outcome run_bounded(const std::string& cmd, const std::string& log) {
  fs::remove(log);
  Outcome o;
  o.exit = run("timeout -s KILL 30 " + cmd, log);
  o.out = slurp(log);
  return o;
}

// Several bounded runs, two at a time (each is mostly start-up), in order of `cmds`.
std::vector<Outcome> run_bounded_all(const std::vector<std::string>& cmds, const std::string& dir) {
  std::vector<Outcome> out(cmds.size());
  for (size_t i = 0; i < cmds.size(); i += 2) {
    std::vector<std::thread> t;
    for (size_t j = i; j < std::min(i + 2, cmds.size()); ++j)
      t.emplace_back([&, j] { out[j] = run_bounded(cmds[j], dir + "/run" + std::to_string(j) + ".log"); });
    for (auto& x : t) x.join();
  }
  return out;
}

// The whole job ended promptly, unsuccessfully, with `message` on its output.
void expect_job_error(const Outcome& o, const std::string& message, const std::string& what) {
  EXPECT_NE(o.exit.code, 0) << what << "\n" << o.out;
  EXPECT_NE(o.exit.code, 137) << what << ": killed by the timeout (the job hung)\n" << o.out;
  EXPECT_LT(o.exit.seconds, 10.0) << what << "\n" << o.out;
  EXPECT_TRUE(has(o.out, message)) << what << ": expected '" << message << "'\n" << o.out;
}

}  // namespace

class Faults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_data = ensure_corpus("sb_rel_faults_corpus", "--docs 60 --max-len 256 --min-len 32 --seed 5");
  }
};

// ---- 1. an error on one rank ends the job (it used to hang in MPI_Finalize)
TEST_F(Faults, InjectedErrorInEveryPhaseEndsTheJobWithTheMessage) {
  auto dir = scratch("inject");
  const std::vector<std::string> phases = {"plan",    "predict", "exchange", "tune",   "compute",
                                           "reduce",  "update",  "measure",  "record", "checkpoint"};
  std::vector<std::pair<std::string, int>> cases;
  for (const auto& phase : phases) cases.push_back({phase, 1});
  cases.push_back({"checkpoint", 0});  // rank 0 too, where it writes the files
  std::vector<std::string> cmds;
  for (const auto& [phase, rank] : cases)
    cmds.push_back(mpirun(2) + train(dir + "/" + phase + std::to_string(rank),
                                     " --set train.inject_error_step=2 --set train.inject_error_rank=" +
                                         std::to_string(rank) + " --set train.inject_error_phase=" + phase));
  auto outcomes = run_bounded_all(cmds, dir);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string r = std::to_string(cases[i].second), phase = cases[i].first;
    expect_job_error(outcomes[i], "error on rank " + r + ": injected fault on rank " + r + " at step 2 in phase " + phase,
                     phase + " on rank " + r);
  }
  // Four ranks, the last one failing while the others wait in the gradient all-reduce.
  auto o = run_bounded(mpirun(4) + train(dir, " --set train.inject_error_step=1 --set train.inject_error_rank=3"
                                              " --set train.inject_error_phase=reduce"),
                       dir + "/run4.log");
  expect_job_error(o, "error on rank 3: injected fault on rank 3 at step 1 in phase reduce", "reduce at 4 ranks");
}

namespace {

// In-place edits of an HDF5 file, as a user with h5py would make them.
void poke_raw(const std::string& file, const std::string& dataset, hsize_t index, double value, hid_t mem_type) {
  sb::h5::Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  sb::h5::Id ds(H5Dopen2(f, dataset.c_str(), H5P_DEFAULT));
  sb::h5::Id space(H5Dget_space(ds));
  const int rank = H5Sget_simple_extent_ndims(space);
  const size_t n = size_t(rank);
  std::vector<hsize_t> dims(n), start(n, 0), one(n, 1);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  for (int d = rank - 1; d >= 0; --d) start[size_t(d)] = index % dims[size_t(d)], index /= dims[size_t(d)];
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, one.data(), nullptr);
  sb::h5::Id ms(H5Screate_simple(rank, one.data(), nullptr));
  uint64_t u = uint64_t(value);
  const void* p = mem_type == H5T_NATIVE_DOUBLE ? static_cast<const void*>(&value) : static_cast<const void*>(&u);
  ASSERT_GE(H5Dwrite(ds, mem_type, ms, space, H5P_DEFAULT, p), 0) << file << " " << dataset;
}
void poke(const std::string& file, const std::string& dataset, hsize_t index, double value, hid_t mem_type) {
  poke_raw(file, dataset, index, value, mem_type);
  sbtest::restamp(file);
}

void set_attr_u64(const std::string& file, const std::string& name, uint64_t value) {
  sb::h5::Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5Adelete(f, name.c_str());
  sb::h5::Id space(H5Screate(H5S_SCALAR));
  sb::h5::Id a(H5Acreate2(f, name.c_str(), H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT));
  H5Awrite(a, H5T_NATIVE_UINT64, &value);
  a.reset(), space.reset(), f.reset();
  sbtest::restamp(file);
}

void delete_attr(const std::string& file, const std::string& name) {
  {
    sb::h5::Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    H5Adelete(f, name.c_str());
  }
  sbtest::restamp(file);
}

std::string copy_data(const std::string& dir) {
  const std::string d = dir + "/data";
  fs::create_directories(d);
  fs::copy_file(g_data + "/shard_00000.h5", d + "/shard_00000.h5", fs::copy_options::overwrite_existing);
  return d;
}

}  // namespace

TEST_F(Faults, RealErrorsOnOneRankEndTheJob) {
  auto dir = scratch("real");
  // A token id >= vocab_size in one document: the rank that reads it names the shard and document.
  const std::string bad = copy_data(dir);
  poke(bad + "/shard_00000.h5", "tokens", 1234, 300, H5T_NATIVE_UINT64);
  const std::string tok = bad + "/shard_00000.h5: dataset '/tokens' has id 300 at token 1234 (document";
  // log.path unusable (rank 0 fails while the others wait in the first collective).
  std::ofstream(dir + "/file") << "a regular file";
  const std::vector<std::tuple<int, std::string, std::string>> cases = {
      {2, " --set data.path=" + bad + " --set train.steps=8", tok},
      {4, " --set data.path=" + bad + " --set train.steps=8", tok},
      {2, " --set log.path=", "error on rank 0: log.path is empty"},
      {4, " --set log.path=" + dir + "/file/m.h5",
       "error on rank 0: " + dir + "/file/m.h5: cannot create the directory of the metrics log (log.path)"},
      {2, " --set log.path=" + g_data + "/shard_00000.h5", "error on rank 0: " + g_data + "/shard_00000.h5: log.path names an input of this run"}};
  std::vector<std::string> cmds;
  for (size_t i = 0; i < cases.size(); ++i)
    cmds.push_back(mpirun(std::get<0>(cases[i])) + train(dir + "/" + std::to_string(i), std::get<1>(cases[i])));
  auto outcomes = run_bounded_all(cmds, dir);
  for (size_t i = 0; i < cases.size(); ++i) expect_job_error(outcomes[i], std::get<2>(cases[i]), cmds[i]);
  EXPECT_GT(fs::file_size(g_data + "/shard_00000.h5"), 1000u) << "the shard named as log.path was replaced";
}

// ---- 2. resume from an older checkpoint: a branch
TEST_F(Faults, ResumeFromAnOlderCheckpointArchivesTheNewerOnes) {
  auto dir = scratch("branch");
  const std::string ck = dir + "/ckpt";
  ASSERT_EQ(run(train(dir, " --set train.steps=12 --set checkpoint.every=4"), dir + "/a.log").code, 0) << slurp(dir + "/a.log");
  auto o = run_bounded(train(dir, " --set train.steps=12 --set checkpoint.every=4 --set checkpoint.keep=2") +
                           " --resume " + sb::checkpoint_path(ck, 4) + " --stop-at 6",
                       dir + "/b.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "checkpoint: " + sb::checkpoint_path(ck, 6))) << o.out;
  EXPECT_TRUE(has(o.out, "starts a branch")) << o.out;
  // The announced checkpoint and its parent are there; the abandoned run's are archived, not deleted.
  EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(ck, 6)).step, 6);
  EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(ck, 4)).step, 4);
  std::string archive;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.is_directory() && e.path().filename().string().starts_with("abandoned_after_step_00000004_")) archive = e.path();
  ASSERT_FALSE(archive.empty()) << o.out;
  EXPECT_TRUE(has(o.out, archive)) << o.out;
  EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(archive, 8)).step, 8);
  EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(archive, 12)).step, 12);
  EXPECT_EQ(sb::read_metrics(archive + "/metrics.h5").steps.size(), 12u);  // the abandoned timeline's log
  // The live log holds one timeline: steps 1..6; a plain --resume continues the branch.
  auto live = sb::read_metrics(dir + "/metrics.h5");
  ASSERT_EQ(live.steps.size(), 6u);
  o = run_bounded(train(dir, " --set train.steps=8 --set checkpoint.every=4") + " --resume", dir + "/c.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "resumed from " + sb::checkpoint_path(ck, 6))) << o.out;
  live = sb::read_metrics(dir + "/metrics.h5");
  ASSERT_EQ(live.steps.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(live.steps[i].step, int64_t(i + 1));
}

// A fresh run (no --resume) into a checkpoint.dir an earlier run used: a branch at step 0. The
// earlier checkpoints and log move into an archive; latest and retention see the new run alone.
TEST_F(Faults, AFreshRunMovesAnEarlierRunsCheckpointsAndLogAside) {
  auto dir = scratch("fresh");
  const std::string ck = dir + "/ckpt";
  ASSERT_EQ(run(train(dir, " --set train.steps=6 --set checkpoint.every=2"), dir + "/a.log").code, 0) << slurp(dir + "/a.log");
  auto o = run_bounded(train(dir, " --set train.steps=3 --set checkpoint.every=2 --set checkpoint.keep=2"), dir + "/b.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "checkpoint: " + sb::checkpoint_path(ck, 3))) << o.out;
  std::string archive;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.is_directory() && e.path().filename().string().starts_with("abandoned_after_step_00000000_")) archive = e.path();
  ASSERT_FALSE(archive.empty()) << o.out;
  EXPECT_TRUE(has(o.out, "held 3 checkpoint(s) of an earlier run")) << o.out;
  EXPECT_TRUE(has(o.out, "moved it to " + archive + "/metrics.h5")) << o.out;
  for (int s : {2, 4, 6}) EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(archive, s)).step, s);
  EXPECT_EQ(sb::read_metrics(archive + "/metrics.h5").steps.size(), 6u);
  // Only the new run's checkpoints are live (the announced one was not pruned for the old 4 and 6).
  const auto live = sb::list_checkpoints(ck);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0], sb::checkpoint_path(ck, 3));
  EXPECT_EQ(live[1], sb::checkpoint_path(ck, 2));
  EXPECT_EQ(sb::read_metrics(dir + "/metrics.h5").steps.size(), 3u);
  // A log with no checkpoints beside it (another checkpoint.dir) moves to metrics.h5.earlier.
  o = run_bounded(train(dir, " --set train.steps=1 --set checkpoint.dir=" + dir + "/other"), dir + "/c.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "moved it to " + dir + "/metrics.h5.earlier")) << o.out;
  EXPECT_EQ(sb::read_metrics(dir + "/metrics.h5.earlier").steps.size(), 3u);
  EXPECT_EQ(sb::read_metrics(dir + "/metrics.h5").steps.size(), 1u);
}

TEST_F(Faults, AMovedAsideLogIsNeverOverwritten) {
  auto dir = scratch("aside");
  ASSERT_EQ(run(train(dir, " --set train.steps=4 --set checkpoint.every=2"), dir + "/a.log").code, 0) << slurp(dir + "/a.log");
  for (const std::string text : {"first broken log", "second broken log"}) {
    std::ofstream(dir + "/metrics.h5", std::ios::trunc) << text;  // a log that cannot be continued
    fs::remove(sb::checkpoint_path(dir + "/ckpt", 6));
    auto o = run_bounded(train(dir, " --set train.steps=6 --set checkpoint.every=2") + " --resume", dir + "/b.log");
    ASSERT_EQ(o.exit.code, 0) << o.out;
    EXPECT_TRUE(has(o.out, "started a new one")) << o.out;
  }
  EXPECT_EQ(slurp(dir + "/metrics.h5.before_step5"), "first broken log");
  EXPECT_EQ(slurp(dir + "/metrics.h5.before_step5.2"), "second broken log");
}

// ---- 3. prep --overwrite replaces the old set only once the new one is complete
TEST_F(Faults, PrepOverwriteKeepsTheOldShardsUntilTheNewSetIsComplete) {
  auto dir = scratch("prep");
  const std::string out = dir + "/data";
  ASSERT_EQ(run(binary() + " prep synth --docs 5 --max-len 64 --min-len 16 --output " + out, dir + "/a.log").code, 0);
  const std::string shard = out + "/shard_00000.h5", before = slurp(shard);
  std::ofstream(dir + "/empty.txt") << "";
  std::ofstream(dir + "/bad.jsonl") << "{\"text\": \"one\"}\n{not json\n";
  std::ofstream(dir + "/short.bin") << "too short";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"text --input " + dir + "/does_not_exist.txt", "does_not_exist.txt: no such input file (--input)"},
      {"text --format jsonl --input " + dir + "/bad.jsonl", "bad.jsonl:2: invalid JSON"},
      {"text --input " + dir + "/empty.txt", "the input holds no documents"},
      {"bin --input " + dir + "/short.bin", "too short"},
      {"text --input " + dir, "is a directory"}};
  for (const auto& [args, msg] : bad) {
    auto o = run_bounded(binary() + " prep " + args + " --output " + out + " --overwrite", dir + "/p.log");
    EXPECT_NE(o.exit.code, 0) << args << "\n" << o.out;
    EXPECT_TRUE(has(o.out, msg)) << args << ": expected '" << msg << "'\n" << o.out;
    EXPECT_EQ(slurp(shard), before) << args << ": the old shard was touched";
    EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1) << args << ": staging left behind";
  }
  // A file that is not a shard (here: what a checkpoint looks like to it) is never deleted: refused
  // up front, nothing changed.
  {
    sb::h5::Id f(H5Fcreate((out + "/keep.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    sb::h5::write_attr(f, "format", std::string(sb::kCheckpointFormat));
  }
  const std::string keep = slurp(out + "/keep.h5");
  std::ofstream(dir + "/ok.txt") << "a new document\n\nand another\n";
  auto o = run_bounded(binary() + " prep text --input " + dir + "/ok.txt --output " + out + " --overwrite", dir + "/p.log");
  EXPECT_NE(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, out + "/keep.h5: not a shard")) << o.out;
  EXPECT_EQ(slurp(shard), before);
  EXPECT_EQ(slurp(out + "/keep.h5"), keep);
  // Without it, the new set replaces the old one.
  fs::remove(out + "/keep.h5");
  o = run_bounded(binary() + " prep text --input " + dir + "/ok.txt --output " + out + " --overwrite", dir + "/p.log");
  ASSERT_EQ(o.exit.code, 0) << o.out;
  EXPECT_NE(slurp(shard), before);
}

// ---- 4. hostile inputs name what is at fault
TEST_F(Faults, HostileInputsAreErrorsNamingTheFlagKeyOrFile) {
  auto dir = scratch("hostile");
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  std::ofstream(dir + "/big.toml") << std::string(2 << 20, '#');
  std::ofstream(dir + "/file") << "x";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {binary() + " train " + dir + flags(dir), dir + ": not a regular file"},
      {binary() + " train /dev/zero" + flags(dir), "/dev/zero: not a regular file"},
      {binary() + " train " + dir + "/fifo" + flags(dir), dir + "/fifo: not a regular file"},
      {binary() + " train " + dir + "/big.toml" + flags(dir), "more than a file read here may hold"},
      {train(dir, " --set data.path=" + dir + "/fifo"), dir + "/fifo: not a regular file or directory"},
      {train(dir) + " --stop-at abc", "--stop-at 'abc': expected a step number >= 1"},
      {train(dir) + " --stop-at -1", "--stop-at '-1'"},
      {train(dir, " --set train.steps=0"), "train.steps = 0: nothing to train"},
      {train(dir) + " --summary /proc/x/s.json", "/proc/x/s.json: cannot create the directory of the summary (--summary)"},
      {train(dir, " --set log.path=" + dir + "/file/m.h5"), "(log.path)"},
      {train(dir) + " --resume " + dir + "/fifo", dir + "/fifo: not a regular file"},
  };
  std::vector<std::string> cmds;  // each its own checkpoint.dir: two runs at a time, one owns a directory
  for (size_t i = 0; i < cases.size(); ++i) cmds.push_back(cases[i].first + " --set checkpoint.dir=" + dir + "/ck" + std::to_string(i));
  auto outcomes = run_bounded_all(cmds, dir);
  for (size_t i = 0; i < cases.size(); ++i) expect_job_error(outcomes[i], cases[i].second, cases[i].first);
}

TEST_F(Faults, ShardVocabOutsideTheModelRangeNamesTheShardAndAttribute) {
  auto dir = scratch("vocab");
  const std::string data = copy_data(dir), shard = data + "/shard_00000.h5";
  const std::string trains = train(dir, " --set data.path=" + data), inspects = binary() + " inspect " + data;
  const std::vector<std::pair<uint64_t, std::string>> cases = {
      {(uint64_t(1) << 32) - 1, trains}, {uint64_t(1) << 32, inspects}, {uint64_t(1) << 31, inspects},
      {(uint64_t(1) << 24) + 1, trains}};
  for (const auto& [v, cmd] : cases) {
    set_attr_u64(shard, "vocab_size", v);
    auto o = run_bounded(cmd, dir + "/v.log");
    expect_job_error(o, shard + ": attribute 'vocab_size' is " + std::to_string(v), cmd);
    expect_job_error(o, "expected 1..16777216 (the range of model.vocab_size)", cmd);
  }
}

TEST_F(Faults, ResumeChecksTheCheckpointAgainstTheConfigAndData) {
  auto dir = scratch("mismatch");
  const std::string ck = dir + "/ckpt", c2 = sb::checkpoint_path(ck, 2);
  ASSERT_EQ(run(train(dir, " --set train.steps=2"), dir + "/a.log").code, 0) << slurp(dir + "/a.log");
  // Another model shape: both shapes named, no latency profile blamed.
  auto o = run_bounded(train(dir, " --set model.n_layers=2 --set train.steps=4") + " --resume " + c2, dir + "/b.log");
  expect_job_error(o, "the checkpoint's model: 1 layers, vocab 259, d_model 16; the configured model: 2 layers", "n_layers");
  EXPECT_FALSE(has(o.out, "latency profile")) << o.out;
  // A dataset of another vocabulary.
  const std::string other = dir + "/other";
  fs::create_directories(other);
  {
    sb::ShardWriter w(other + "/shard_00000.h5", {300, "byte", 257});
    std::vector<uint32_t> doc(200, 65);
    for (int i = 0; i < 20; ++i) w.add(doc);
    w.close();
  }
  o = run_bounded(train(dir, " --set data.path=" + other + " --set train.steps=4") + " --resume " + c2, dir + "/c.log");
  expect_job_error(o, "'model.embed_tokens.weight' [259, 16] does not match the configured model's 'model.embed_tokens.weight' [300, 16]", "vocab");
  // The same shapes from another data.path: a warning naming both.
  const std::string copy = copy_data(dir + "/copy");
  o = run_bounded(train(dir, " --set data.path=" + copy + " --set train.steps=3") + " --resume " + c2, dir + "/d.log");
  EXPECT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "warning: resume: " + c2 + " was trained on data.path = " + g_data) && has(o.out, copy)) << o.out;
  // eval --checkpoint latest: the newest in checkpoint.dir.
  o = run_bounded(binary() + " eval --checkpoint latest --set checkpoint.dir=" + ck + " --set eval.docs=2", dir + "/e.log");
  EXPECT_EQ(o.exit.code, 0) << o.out;
  EXPECT_TRUE(has(o.out, "eval " + sb::checkpoint_path(ck, 3))) << o.out;
}

TEST_F(Faults, NonFiniteValuesInTheCheckpointModelsAreCaught) {
  auto dir = scratch("nanck");
  const std::string ck = dir + "/ckpt";
  ASSERT_EQ(run(train(dir, " --set train.steps=2 --set checkpoint.keep=5"), dir + "/a.log").code, 0) << slurp(dir + "/a.log");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // The checksum covers /latency and /recall.
  for (const std::string ds : {"latency/coeffs", "recall/alpha"}) {
    fs::copy_file(sb::checkpoint_path(ck, 2), dir + "/x.h5", fs::copy_options::overwrite_existing);
    poke(dir + "/x.h5", ds, 0, nan, H5T_NATIVE_DOUBLE);
    EXPECT_TRUE(has(error_of([&] { sb::read_checkpoint(dir + "/x.h5"); }), "checksum mismatch in /latency, /recall")) << ds;
    // Without the checksum (as a checkpoint written before it existed): the value check names the dataset.
    delete_attr(dir + "/x.h5", "checksum_extra");
    auto o = run_bounded(train(dir, " --set train.steps=3") + " --resume " + dir + "/x.h5", dir + "/r.log");
    expect_job_error(o, ds == "recall/alpha" ? "dataset 'recall/alpha' holds nan" : "dataset 'coeffs' of the latency profile holds nan", ds);
  }
}

TEST_F(Faults, SigtermDuringStartupStopsCleanlyAfterTheFirstStep) {
  auto dir = scratch("sigterm");
  const std::string log = dir + "/run.log";
  pid_t pid = spawn(train(dir, " --set train.steps=50"), log);
  // As soon as the process has its handler (the first thing main does), before MPI and the config.
  auto t0 = std::chrono::steady_clock::now();
  bool caught = false;
  while (!caught && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::string st = slurp("/proc/" + std::to_string(pid) + "/status");
    auto at = st.find("SigCgt:");
    caught = at != std::string::npos && (std::stoull(st.substr(at + 7), nullptr, 16) >> (SIGTERM - 1)) & 1;
    if (!caught) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_TRUE(caught);
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  std::string out = slurp(log);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal: " << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_TRUE(has(out, "stopping after step 1 as asked")) << out;
  EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt", 1)).step, 1);
}

TEST(FaultsSchema, ShardVocabLimitIsTheModelVocabRange) {
  EXPECT_EQ(double(sb::kMaxShardVocab), sb::find_key("model.vocab_size")->max);
}

TEST_F(Faults, MetricsLogOnAFullDiskNamesThePathAndTheCause) {
  auto dir = scratch("logfull");
  const std::string mnt = dir + "/mnt";
  fs::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=16384") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  struct Unmount { std::string p; ~Unmount() { umount(p.c_str()); } } um{mnt};
  for (int np : {1, 2}) {
    fs::remove_all(mnt + "/m.h5");
    auto o = run_bounded((np > 1 ? mpirun(np) : "") +
                             train(dir + "/" + std::to_string(np), " --set log.path=" + mnt + "/m.h5 --set log.every=1"
                                   " --set train.steps=400 --set checkpoint.every=0 --set train.global_batch_tokens=64"
                                   " --set train.micro_batch_tokens=64"),
                         dir + "/full.log");
    expect_job_error(o, mnt + "/m.h5: writing the metrics log (log.path) failed", "full disk");
    expect_job_error(o, "disk full (ENOSPC)", "full disk");
  }
}
