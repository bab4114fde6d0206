// Helpers for the training integration tests: run the real binary (under mpirun) and read
// what it wrote.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/comm/comm.hpp"
#include "src/config/config.hpp"
#include "tests/run_program.hpp"

namespace sbtest {

inline std::string binary() { return program(); }

// Runs a shell command in a clean environment; returns its exit code; output appended to `log`.
inline int sh(const std::string& cmd, const std::string& log) {
  Run r = run_clean(cmd);
  std::ofstream(log, std::ios::app) << r.out;
  return r.rc;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

// mpirun prefix for n ranks (root allowed, oversubscribed: CI has 2 cores).
inline std::string mpirun(int n) {
  return "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(n) + " ";
}

// A small synthetic corpus, made once per directory.
inline std::string make_corpus(const std::string& dir, int docs = 160, int max_len = 1024) {
  std::string data = dir + "/data";
  if (!std::filesystem::exists(data + "/shard_00000.h5")) {
    std::string cmd = binary() + " prep synth --preset longalign --docs " + std::to_string(docs) +
                      " --seed 3 --max-len " + std::to_string(max_len) + " --min-len 48 --output " + data;
    if (sh(cmd, dir + "/prep.log") != 0) throw std::runtime_error("prep failed: " + slurp(dir + "/prep.log"));
  }
  return data;
}

// Flags of a tiny, fast training run writing into `dir`.
inline std::string tiny_flags(const std::string& data, const std::string& dir) {
  return " --set data.path=" + data + " --set checkpoint.dir=" + dir + "/ckpt --set log.path=" + dir +
         "/metrics.h5 --set model.d_model=32 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.ffn_dim=64"
         " --set train.global_batch_tokens=2048 --set train.micro_batch_tokens=512 --set attention.block_size=16"
         " --set train.warmup_steps=2 --set log.progress=false --set train.sync_check_every=1";
}

// A fresh corpus in a per-rank-count scratch dir (rank 0 makes it).
inline std::string scratch(const sb::Comm& comm, const std::string& tag) {
  namespace fs = std::filesystem;
  std::string dir = (fs::temp_directory_path() / ("sb_train_mpi_" + tag + "_np" + std::to_string(comm.size()))).string();
  if (comm.root()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    make_corpus(dir, 200, 1024);
  }
  comm.barrier();
  return dir;
}

// The tiny config plus "--set k=v ..." flags (later ones win), as the CLI would load them.
inline sb::Config tiny_config(const std::string& dir, const std::string& extra) {
  std::vector<std::string> sets;
  std::string flags = tiny_flags(dir + "/data", dir) + " " + extra;
  for (size_t at = flags.find("--set "); at != std::string::npos; at = flags.find("--set ", at + 1)) {
    size_t end = flags.find(' ', at + 6);
    sets.push_back(flags.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6));
  }
  return sb::Config::load("", sets);
}

}  // namespace sbtest
