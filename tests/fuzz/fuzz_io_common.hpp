// Shared by the HDF5 fuzz targets: the input's bytes are written as a file (in /dev/shm when it
// exists, so the fuzzer does not wear the disk) and the reader under test opens it.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "io/h5.hpp"

namespace sbfuzz {

inline std::string scratch(const char* tag) {
  static std::string path = [&] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/sb_fuzz_" + tag + "_" + std::to_string(getpid()) + ".h5";
  }();
  return path;
}

inline bool write_file(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

// After each input: remove its file, and trap if any HDF5 id opened for it is still open (a leak
// keeps the file open).
inline void end_input(const std::string& path) {
  unlink(path.c_str());
  if (ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); open != 0) {
    std::fprintf(stderr, "%zd HDF5 ids left open after one input\n", open);
    __builtin_trap();
  }
}

}  // namespace sbfuzz
