// Helpers shared by the data tests: a fresh scratch directory per process and error capture.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <filesystem>

#include "tests/error_of.hpp"
#include <fstream>
#include <string>
#include <vector>

#include "base/error.hpp"

namespace sbt {

using sbtest::error_of;

// Removes the scratch directories when the test process ends.
struct ScratchDirs {
  std::vector<std::string> dirs;
  ~ScratchDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

// A scratch directory unique to this process (and test name), emptied first.
inline std::string scratch(const std::string& name) {
  static ScratchDirs all;
  auto p = std::filesystem::temp_directory_path() / ("sb_data_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  all.dirs.push_back(p.string());
  return p.string();
}


inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace sbt

// The message must name both the file and the field at fault.
#define EXPECT_ERROR_NAMES(msg, file, field)                                  \
  do {                                                                        \
    std::string m_ = (msg);                                                   \
    EXPECT_NE(m_.find(file), std::string::npos) << "file not named: " << m_;  \
    EXPECT_NE(m_.find(field), std::string::npos) << "field not named: " << m_; \
  } while (0)
