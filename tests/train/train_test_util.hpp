// Helpers for the training integration tests: run the real binary (under mpirun) and read
// what it wrote.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

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

}  // namespace sbtest
