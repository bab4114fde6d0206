// Shared by the convert tests: the fixtures tests/convert/make_fixtures.py writes (numpy, no
// torch) into the build directory, the committed transformers fixtures, and small file helpers.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/run_program.hpp"

namespace sbtest {

namespace fs = std::filesystem;

// Generated once per process (make_fixtures.py takes under a second), removed at exit.
inline const std::string& gen_dir() {
  struct Gen {
    std::string dir = std::string(SB_BINARY_DIR) + "/tests/convert/gen_" + std::to_string(::getpid());
    Gen() {
      Run r = run_clean("/usr/bin/python3 " + sh_quote(std::string(SB_SOURCE_DIR) + "/tests/convert/make_fixtures.py") +
                        " " + sh_quote(dir));
      if (r.rc != 0) ADD_FAILURE() << "make_fixtures.py failed (needs /usr/bin/python3 with numpy):\n" << r.out;
    }
    ~Gen() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  };
  static const Gen gen;
  return gen.dir;
}

// A small synthetic dataset (prep synth, byte vocabulary 259), made once per process.
inline const std::string& synth_data() {
  static const std::string dir = [] {
    std::string d = gen_dir() + "/synth";
    Run r = run_clean(program() + " prep synth --output " + sh_quote(d) + " --docs 8 --max-len 300 --min-len 50");
    if (r.rc != 0) ADD_FAILURE() << "prep synth failed:\n" << r.out;
    return d;
  }();
  return dir;
}

inline std::string committed(const std::string& rel) {
  return std::string(SB_SOURCE_DIR) + "/tests/convert/fixtures/" + rel;
}

// A fresh scratch directory per test, removed at the end.
struct Scratch {
  std::string path;
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::string(SB_BINARY_DIR) + "/tests/convert/scratch_" + info->test_suite_name() + "_" + info->name() + "_" +
           std::to_string(::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace sbtest
