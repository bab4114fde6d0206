// libFuzzer target: the checkpoint reader (read_checkpoint: format, version, names, shapes,
// dtypes, counts, checksum). The input is the bytes of an .h5 checkpoint (run_fuzz.sh seeds the
// corpus with real ones). Rejections must be sb::Error; an accepted checkpoint must be coherent.
#include <cstdint>
#include <cstdio>

#include "fuzz_io_common.hpp"
#include "io/checkpoint.hpp"
#include "base/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input is a file this program wrote, damaged: one without its whole-file checksum is
  // refused too (files of other tools take libhdf5's path; io/RELIABILITY.md, "Fuzzing").
  static bool once = (sb::h5::quiet_errors(), sb::h5::require_checksums(true), true);
  (void)once;
  const std::string path = sbfuzz::scratch("ckpt");
  if (!sbfuzz::write_file(path, data, size)) return 0;
  try {
    sb::Checkpoint ck = sb::read_checkpoint(path);
    size_t total = 0;
    for (const auto& t : ck.tensors) {
      if (t.offset != total) __builtin_trap();
      total += t.size;
    }
    if (total != ck.params.size() || ck.m.size() != total || ck.v.size() != total) __builtin_trap();
  } catch (const sb::Error&) {
  }
  sbfuzz::end_input(path);
  return 0;
}
