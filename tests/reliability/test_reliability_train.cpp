// Issue 7: the training job under faults, through the real binary.
//  1. kill -9 at many moments (checkpoint every step): every listed checkpoint verifies, no
//     *.h5.tmp is picked up, --resume continues and ends bit-identical to an uninterrupted run;
//     a corrupt latest checkpoint is skipped with a warning naming it; an explicit one is an error.
//  2. checkpoint writes that fail (parent path a regular file; a full tmpfs when mount works).
//  3. NaN/inf injected (train.inject_nan_step): skip (with the consecutive limit) or stop.
//  4. a rank killed with -9 under mpirun: the job ends within seconds, naming the rank.
//  6. a 2-rank checkpoint resumed on 1 rank: same losses to 1e-4, with the note.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <regex>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/metrics_log.hpp"
#include "reliability_util.hpp"

using namespace rel;

namespace {

std::string g_data;

std::string flags(const std::string& dir, const std::string& extra = "") {
  return " --set data.path=" + g_data + " --set checkpoint.dir=" + dir + "/ckpt --set log.path=" + dir +
         "/metrics.h5 --set model.d_model=32 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.ffn_dim=64"
         " --set train.global_batch_tokens=2048 --set train.micro_batch_tokens=512 --set attention.block_size=16"
         " --set train.warmup_steps=2 --set log.progress=false --set train.sync_check_every=1"
         " --set checkpoint.every=1" + extra;
}

std::string train_cmd(const std::string& dir, const std::string& extra) {
  return binary() + " train" + flags(dir, extra);
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

class Reliability : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_data = ensure_corpus("sb_rel_corpus", "--docs 120 --max-len 512 --min-len 48 --seed 5");
  }
};

// ---- 1. kill -9 at varied moments, including inside checkpoint writes
TEST_F(Reliability, KillNineAtRandomMomentsAlwaysLeavesALoadableCheckpoint) {
  const int steps = 20;
  const std::string extra = " --set train.steps=" + std::to_string(steps) + " --set checkpoint.keep=3";
  auto ref = scratch("kill_ref");
  ASSERT_EQ(run(train_cmd(ref, extra), ref + "/run.log").code, 0) << slurp(ref + "/run.log");
  auto want = sb::read_checkpoint(sb::checkpoint_path(ref + "/ckpt", steps));

  auto dir = scratch("kill");
  const std::string log = dir + "/runs.log";
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> delay_ms(0, 700);
  int kills = 0, tmp_seen = 0, finished = 0, mid_write = 0;
  std::regex ok_name("ckpt_[0-9]{8}\\.h5(\\.tmp)?|\\.sparsebalance\\.lock");  // and the run's lock (io/dir_lock.hpp)
  auto newest = [&] {
    auto all = sb::list_checkpoints(dir + "/ckpt");
    return all.empty() ? std::string() : all.front();
  };
  auto has_tmp = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir + "/ckpt", ec))
      if (e.path().string().ends_with(".tmp")) return true;
    return false;
  };
  for (int i = 0; i < 8 && !finished; ++i) {
    // Even iterations: kill the moment a checkpoint temporary appears (inside a write). Odd ones:
    // a random delay after the run's first new checkpoint (anywhere in a step or a write).
    const std::string before = newest();
    pid_t pid = spawn(train_cmd(dir, extra) + " --resume", log);
    int ms = delay_ms(rng), status = 0;
    bool started = false, killed = false;
    auto t0 = std::chrono::steady_clock::now(), t_new = t0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (!started && newest() != before) started = true, t_new = now;
      const bool in_write = i % 2 == 0 && has_tmp();
      if (in_write || (started && i % 2 == 1 && now - t_new > std::chrono::milliseconds(ms)) ||
          now - t0 > std::chrono::seconds(60)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ++kills, killed = true, mid_write += in_write;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    (void)killed;
    if (WIFEXITED(status)) {
      ASSERT_EQ(WEXITSTATUS(status), 0) << slurp(log);
      finished = 1;
    }
    // Invariants after each kill: only checkpoint names (and temporaries) in the directory, and
    // every listed checkpoint is complete and verifies.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir + "/ckpt", ec)) {
      std::string name = e.path().filename().string();
      EXPECT_TRUE(std::regex_match(name, ok_name)) << name;
      tmp_seen += name.ends_with(".tmp");
    }
    for (const auto& p : sb::list_checkpoints(dir + "/ckpt")) {
      EXPECT_FALSE(p.ends_with(".tmp"));
      EXPECT_NO_THROW(sb::read_checkpoint(p)) << p << " after kill " << kills << " (" << ms << " ms)";
    }
  }
  std::printf("[ reliability ] %d kills (%d inside a checkpoint write), %d temporaries left behind\n", kills,
              mid_write, tmp_seen);
  EXPECT_GE(kills, 5);
  EXPECT_GE(mid_write, 1);
  if (!finished) {
    ASSERT_EQ(run(train_cmd(dir, extra) + " --resume", log).code, 0) << slurp(log);
  }
  std::string out = slurp(log);
  std::regex resumed("resumed from ([^ ]+) at step");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), resumed); it != std::sregex_iterator(); ++it)
    EXPECT_TRUE((*it)[1].str().ends_with(".h5")) << (*it)[1].str();
  EXPECT_TRUE(has(out, "resumed from")) << out;
  auto got = sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt", steps));
  EXPECT_TRUE(got.params == want.params) << "parameters after kills+resumes differ from the uninterrupted run";
  EXPECT_TRUE(got.m == want.m && got.v == want.v);
  for (const auto& e : fs::directory_iterator(dir + "/ckpt")) EXPECT_FALSE(e.path().string().ends_with(".tmp"));
  auto logt = sb::read_metrics(dir + "/metrics.h5");
  ASSERT_EQ(logt.steps.size(), size_t(steps));
  for (int s = 0; s < steps; ++s) EXPECT_EQ(logt.steps[size_t(s)].step, s + 1);
}

TEST_F(Reliability, CorruptLatestCheckpointFallsBackWithAWarning) {
  auto dir = scratch("corrupt");
  const std::string ck = dir + "/ckpt";
  ASSERT_EQ(run(train_cmd(dir, " --set train.steps=4 --set checkpoint.keep=5"), dir + "/a.log").code, 0)
      << slurp(dir + "/a.log");
  const std::string c2 = sb::checkpoint_path(ck, 2), c3 = sb::checkpoint_path(ck, 3), c4 = sb::checkpoint_path(ck, 4);
  auto name = sb::read_checkpoint(c3).tensors.at(0).name;
  flip_dataset_byte(c3, "params/" + name, 3);                   // checksum mismatch
  fs::resize_file(c4, fs::file_size(c4) / 2);                   // torn / unreadable
  std::ofstream(ck + "/ckpt_00000005.h5.tmp") << "half a checkpoint";  // a stale temporary
  // An explicit corrupt path stays an error naming the file.
  auto e = run(train_cmd(dir, " --set train.steps=6") + " --resume " + c3, dir + "/explicit.log");
  std::string out = slurp(dir + "/explicit.log");
  EXPECT_NE(e.code, 0) << out;
  EXPECT_EQ(e.signal, 0) << out;
  EXPECT_TRUE(has(out, c3) && has(out, "checksum mismatch")) << out;
  // 'latest' skips both bad ones with warnings naming them, and resumes from step 2.
  e = run(train_cmd(dir, " --set train.steps=6") + " --resume --summary " + dir + "/s.json", dir + "/latest.log");
  out = slurp(dir + "/latest.log");
  ASSERT_EQ(e.code, 0) << out;
  EXPECT_TRUE(has(out, "warning") && has(out, c4)) << out;
  EXPECT_TRUE(has(out, c3) && has(out, "checksum mismatch")) << out;
  EXPECT_TRUE(has(out, "resumed from " + c2)) << out;
  EXPECT_TRUE(has(out, "stale temporary")) << out;
  EXPECT_FALSE(fs::exists(ck + "/ckpt_00000005.h5.tmp"));
  EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(ck, 6)).step, 6);
  // Nothing readable at all: an error, not a silent fresh start.
  auto d2 = scratch("corrupt_all");
  fs::create_directories(d2 + "/ckpt");
  std::ofstream(sb::checkpoint_path(d2 + "/ckpt", 3)) << "garbage";
  e = run(train_cmd(d2, " --set train.steps=4") + " --resume", d2 + "/run.log");
  out = slurp(d2 + "/run.log");
  EXPECT_NE(e.code, 0) << out;
  EXPECT_TRUE(has(out, "no readable checkpoint") && has(out, sb::checkpoint_path(d2 + "/ckpt", 3))) << out;
}

// ---- 2. checkpoint writes that fail
TEST_F(Reliability, CheckpointWriteFailureStopsOrContinues) {
  // As root chmod does not stop writes: make the checkpoint dir's parent a regular file.
  auto dir = scratch("wfail");
  std::ofstream(dir + "/file") << "not a directory";
  const std::string bad = " --set checkpoint.dir=" + dir + "/file/ckpt --set train.steps=3";
  auto e = run(train_cmd(dir, bad), dir + "/stop.log");
  std::string out = slurp(dir + "/stop.log");
  EXPECT_NE(e.code, 0) << out;
  EXPECT_EQ(e.signal, 0) << out;
  EXPECT_TRUE(has(out, dir + "/file/ckpt") && has(out, "on_error")) << out;
  e = run(train_cmd(dir, bad + " --set checkpoint.on_error=continue") + " --summary " + dir + "/s.json",
          dir + "/cont.log");
  out = slurp(dir + "/cont.log");
  EXPECT_EQ(e.code, 0) << out;
  EXPECT_TRUE(has(out, "warning") && has(out, dir + "/file/ckpt") && has(out, "training continues")) << out;
  EXPECT_TRUE(has(slurp(dir + "/s.json"), "\"last_step\": 3") || has(slurp(dir + "/s.json"), "\"last_step\":3"))
      << slurp(dir + "/s.json");
}

TEST_F(Reliability, DiskFullKeepsThePreviousCheckpointIntact) {
  auto dir = scratch("full");
  auto probe = scratch("full_probe");
  ASSERT_EQ(run(train_cmd(probe, " --set train.steps=1"), probe + "/run.log").code, 0) << slurp(probe + "/run.log");
  const auto size = fs::file_size(sb::checkpoint_path(probe + "/ckpt", 1));
  const std::string mnt = dir + "/mnt";
  fs::create_directories(mnt);
  std::string opts = "size=" + std::to_string((size * 3 / 2 / 4096 + 1) * 4096);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "); covered by the regular-file case";
  struct Unmount { std::string p; ~Unmount() { umount(p.c_str()); } } um{mnt};
  const std::string where = " --set checkpoint.dir=" + mnt + "/ckpt --set checkpoint.keep=1 --set train.steps=3";
  auto e = run(train_cmd(dir, where), dir + "/stop.log");
  std::string out = slurp(dir + "/stop.log");
  EXPECT_NE(e.code, 0) << out;
  EXPECT_TRUE(has(out, sb::checkpoint_path(mnt + "/ckpt", 2)) && has(out, "previous checkpoints untouched")) << out;
  auto all = sb::list_checkpoints(mnt + "/ckpt");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(sb::read_checkpoint(all[0]).step, 1);
  for (const auto& f : fs::directory_iterator(mnt + "/ckpt")) EXPECT_FALSE(f.path().string().ends_with(".tmp"));
  e = run(train_cmd(dir, where + " --set checkpoint.on_error=continue"), dir + "/cont.log");
  out = slurp(dir + "/cont.log");
  EXPECT_EQ(e.code, 0) << out;
  EXPECT_TRUE(has(out, "warning") && has(out, "training continues")) << out;
  // This second run is a fresh one: the first run's checkpoint moved into an archive (on the same
  // file system, so it still fills the disk), intact; the failed writes left no temporaries.
  std::string archive;
  for (const auto& f : fs::directory_iterator(mnt + "/ckpt")) {
    EXPECT_FALSE(f.path().string().ends_with(".tmp"));
    if (f.is_directory() && f.path().filename().string().starts_with("abandoned_after_step_00000000_")) archive = f.path();
  }
  ASSERT_FALSE(archive.empty()) << out;
  EXPECT_EQ(sb::read_checkpoint(sb::checkpoint_path(archive, 1)).step, 1);
}

// ---- 3. NaN/inf: skip (with the consecutive limit) or stop
TEST_F(Reliability, NonFiniteStepsAreSkippedAndLogged) {
  auto dir = scratch("nan_skip");
  auto e = run(train_cmd(dir, " --set train.steps=6 --set checkpoint.keep=10 --set train.inject_nan_step=3"
                              " --set train.inject_nan_count=2 --set train.max_skips=2"),
               dir + "/run.log");
  std::string out = slurp(dir + "/run.log");
  ASSERT_EQ(e.code, 0) << out;
  EXPECT_TRUE(has(out, "step 3 skipped") && has(out, "step 4 skipped")) << out;
  auto log = sb::read_metrics(dir + "/metrics.h5");
  ASSERT_EQ(log.steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(log.steps[i].skipped, (i == 2 || i == 3) ? 1 : 0) << "step " << i + 1;
  auto c2 = sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt", 2));
  auto c4 = sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt", 4));
  EXPECT_TRUE(c2.params == c4.params && c2.m == c4.m) << "a skipped step changed the model";
  auto c5 = sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt", 5));
  EXPECT_FALSE(c5.params == c4.params);
  EXPECT_EQ(c4.skipped_steps, 2);
  EXPECT_EQ(c5.skipped_steps, 0);
}

TEST_F(Reliability, TooManyConsecutiveNonFiniteStepsStop) {
  auto dir = scratch("nan_limit");
  auto e = run(train_cmd(dir, " --set train.steps=8 --set checkpoint.keep=10 --set train.inject_nan_step=3"
                              " --set train.inject_nan_count=5 --set train.max_skips=2"),
               dir + "/run.log");
  std::string out = slurp(dir + "/run.log");
  EXPECT_NE(e.code, 0) << out;
  EXPECT_EQ(e.signal, 0) << out;
  EXPECT_TRUE(has(out, "step 5") && has(out, "train.max_skips = 2")) << out;
  auto c2 = sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt", 2));
  auto latest = sb::read_checkpoint(sb::list_checkpoints(dir + "/ckpt").at(0));
  EXPECT_EQ(latest.step, 4);
  EXPECT_TRUE(latest.params == c2.params) << "the last checkpoint must hold the last good parameters";
}

TEST_F(Reliability, NonFiniteStopPolicyStopsBeforeTheUpdate) {
  auto dir = scratch("nan_stop");
  auto e = run(train_cmd(dir, " --set train.steps=6 --set train.inject_nan_step=3 --set train.nonfinite=stop"),
               dir + "/run.log");
  std::string out = slurp(dir + "/run.log");
  EXPECT_NE(e.code, 0) << out;
  EXPECT_EQ(e.signal, 0) << out;
  EXPECT_TRUE(has(out, "step 3: non-finite") && has(out, sb::checkpoint_path(dir + "/ckpt", 2))) << out;
  auto all = sb::list_checkpoints(dir + "/ckpt");
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(sb::read_checkpoint(all[0]).step, 2);
  // It resumes from the last good checkpoint once the fault is gone.
  e = run(train_cmd(dir, " --set train.steps=4") + " --resume", dir + "/resume.log");
  EXPECT_EQ(e.code, 0) << slurp(dir + "/resume.log");
}

// ---- 4. a rank dies
TEST_F(Reliability, KilledRankEndsTheJobQuicklyNamingTheRank) {
  auto dir = scratch("rankdie");
  const std::string log = dir + "/run.log";
  pid_t pid = spawn(mpirun(2) + train_cmd(dir, " --set train.steps=3000 --set checkpoint.every=0"), log);
  struct Reap {  // on any early exit: mpirun forwards SIGTERM to its ranks
    pid_t pid;
    ~Reap() {
      if (waitpid(pid, nullptr, WNOHANG) != 0) return;
      kill(pid, SIGTERM);
      for (int i = 0; i < 100 && waitpid(pid, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (kill(pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
    }
  } reap{pid};
  // Find rank 1 among mpirun's children once training runs (its first log flush).
  pid_t victim = -1;
  auto t0 = std::chrono::steady_clock::now();
  while (victim < 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (fs::exists(dir + "/metrics.h5")) victim = rank_pid(pid, 1);
  }
  ASSERT_GT(victim, 0) << "rank 1 not found; " << slurp(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto t1 = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t1 > std::chrono::seconds(30)) {
      kill(pid, SIGTERM);  // mpirun takes the surviving rank down with it
      waitpid(pid, &status, 0);
      FAIL() << "the job hung after rank 1 died: " << slurp(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::string out = slurp(log);
  EXPECT_LT(secs, 10.0) << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_TRUE(has(out, "rank 1")) << out;
  std::printf("[ reliability ] job ended %.2f s after rank 1 was killed\n", secs);
}

// ---- 6. resume with a different rank count
TEST_F(Reliability, TwoRankCheckpointResumesOnOneRank) {
  auto full = scratch("np_full"), part = scratch("np_part");
  const std::string x = " --set train.steps=6 --set balance.batching=tokens";
  ASSERT_EQ(run(mpirun(2) + train_cmd(full, x) + " --summary " + full + "/s.json", full + "/run.log").code, 0)
      << slurp(full + "/run.log");
  ASSERT_EQ(run(mpirun(2) + train_cmd(part, x) + " --stop-at 3 --summary " + part + "/a.json", part + "/a.log").code, 0)
      << slurp(part + "/a.log");
  ASSERT_EQ(run(train_cmd(part, x) + " --resume --summary " + part + "/b.json", part + "/b.log").code, 0)
      << slurp(part + "/b.log");
  std::string out = slurp(part + "/b.log");
  EXPECT_TRUE(has(out, "written by 2 ranks, this run has 1")) << out;
  // The metrics log has one column per rank: the 1-rank continuation moves it aside and starts anew.
  EXPECT_TRUE(has(out, "started a new one")) << out;
  EXPECT_TRUE(fs::exists(part + "/metrics.h5.before_step4"));
  auto losses = [](const std::string& json) {
    std::vector<double> v;
    auto a = json.find("\"losses\"");
    auto b = json.find('[', a), c = json.find(']', b);
    std::string s = json.substr(b + 1, c - b - 1);
    for (size_t p = 0; p < s.size();) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      v.push_back(std::stod(s.substr(p, q - p)));
      p = q + 1;
    }
    return v;
  };
  auto f = losses(slurp(full + "/s.json"));
  auto joined = losses(slurp(part + "/a.json"));
  for (double l : losses(slurp(part + "/b.json"))) joined.push_back(l);
  ASSERT_EQ(f.size(), 6u);
  ASSERT_EQ(joined.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(joined[i], f[i], 1e-4) << "step " << i + 1;
}
