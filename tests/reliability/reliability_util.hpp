// Helpers for the reliability tests: scratch dirs, a clean environment for child processes
// (a child started from inside an MPI test must not inherit OMPI_*/PMIX_*), error capture,
// and surgery on HDF5 files (flip a byte inside a dataset's stored data).
#pragma once
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "io/h5.hpp"
#include "base/error.hpp"
#include "tests/error_of.hpp"
#include "tests/run_program.hpp"

namespace rel {

using sbtest::error_of;

namespace fs = std::filesystem;

inline std::string binary() { return std::string(SB_BINARY_DIR) + "/src/sparsebalance"; }

inline std::string scratch(const std::string& name) {
  auto p = fs::temp_directory_path() / ("sb_rel_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline std::string mpirun(int n) {
  return "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(n) + " -x OPENBLAS_NUM_THREADS=1 ";
}

struct Exit {
  int code = -1;    // exit status when exited normally
  int signal = 0;   // the signal that ended the shell's child, if any (shell reports 128+n)
  double seconds = 0;
};

// Runs `cmd` in a clean environment; stdout+stderr appended to `log`.
inline Exit run(const std::string& cmd, const std::string& log) {
  auto t0 = std::chrono::steady_clock::now();
  std::string full = sbtest::clean_env() + "sh -c " + sbtest::sh_quote(cmd) + " >>" + log + " 2>&1";
  int rc = std::system(full.c_str());
  Exit e;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(rc)) {
    e.code = WEXITSTATUS(rc);
    if (e.code > 128 && e.code < 160) e.signal = e.code - 128;
  } else if (WIFSIGNALED(rc)) {
    e.signal = WTERMSIG(rc);
  }
  return e;
}

// Starts `cmd` (exec'd, so the pid is the program's own) in a clean environment, output to log.
// The small corpus a test suite trains on, made once under the temp directory `name` (the
// suite's SetUpTestSuite): its data path, or "" (with the prep log in the failure) if prep failed.
inline std::string ensure_corpus(const std::string& name, const std::string& prep_flags) {
  const auto dir = (fs::temp_directory_path() / name).string();
  const std::string data = dir + "/data";
  if (fs::exists(data + "/shard_00000.h5")) return data;
  fs::create_directories(dir);
  const Exit e = run(binary() + " prep synth " + prep_flags + " --output " + data, dir + "/prep.log");
  if (e.code != 0) {
    ADD_FAILURE() << "prep synth failed:\n" << slurp(dir + "/prep.log");
    return "";
  }
  return data;
}

inline pid_t spawn(const std::string& cmd, const std::string& log) {
  std::string full = "exec " + sbtest::clean_env() + cmd + " >>" + log + " 2>&1";
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", full.c_str(), (char*)nullptr);
    _exit(127);
  }
  return pid;
}


// The pid of rank `rank` of the job mpirun `mpirun_pid` started (a sparsebalance whose parent, or
// grandparent, is that mpirun), or -1 while there is none.
inline pid_t rank_pid(pid_t mpirun_pid, int rank) {
  auto contains = [](const std::string& t, const std::string& w) { return t.find(w) != std::string::npos; };
  std::error_code ec;  // processes come and go while /proc is listed: skip what vanished
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& e = it->path();
    const std::string pid_name = e.filename().string();
    if (pid_name.empty() || pid_name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = slurp(e.string() + "/stat");
    if (stat.empty() || !contains(stat, "(sparsebalance)") || stat.rfind(')') + 4 >= stat.size()) continue;
    std::string env = slurp(e.string() + "/environ");
    for (auto& c : env) c = c ? c : '\n';
    if (!contains(env, "\nOMPI_COMM_WORLD_RANK=" + std::to_string(rank) + "\n") || !contains(env, "OMPI_MCA_orte_hnp_uri"))
      continue;
    const int pp = std::atoi(stat.c_str() + stat.rfind(')') + 4);
    const std::string ppid_stat = slurp("/proc/" + std::to_string(pp) + "/stat");
    if (pp == mpirun_pid || contains(ppid_stat, " " + std::to_string(mpirun_pid) + " ")) return std::atoi(pid_name.c_str());
  }
  return -1;
}

// Flips one byte of the raw data of a contiguous dataset, in place.
inline void flip_dataset_byte(const std::string& file, const std::string& dataset, size_t at = 0) {
  haddr_t off;
  {
    sb::h5::Id f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    sb::h5::Id ds(H5Dopen2(f, dataset.c_str(), H5P_DEFAULT));
    off = H5Dget_offset(ds);
    if (off == HADDR_UNDEF) throw std::runtime_error(dataset + " is not contiguous");
  }
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(off + at));
  char c = 0;
  io.read(&c, 1);
  c = char(c ^ 0x5a);
  io.seekp(std::streamoff(off + at));
  io.write(&c, 1);
}

}  // namespace rel
