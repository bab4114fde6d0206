// After an in-place edit (raw HDF5 calls, as a user with h5py r+ would make it) of a file the
// program wrote: its whole-file checksum again (io/file_checksum.hpp), so that a test reaches the
// check it is about instead of the checksum. Files without a checksum block are left as they are.
#pragma once
#include <cstring>
#include <fstream>
#include <string>

#include "io/file_checksum.hpp"

namespace sbtest {

inline void restamp(const std::string& path) {
  char sig[8] = {};
  std::ifstream in(path, std::ios::binary);
  in.seekg(std::streamoff(sb::kChecksumBlock));
  if (!in.read(sig, 8) || std::memcmp(sig, "\x89HDF\r\n\x1a\n", 8) != 0) return;
  in.close();
  sb::stamp_file_checksum(path);
}

}  // namespace sbtest
