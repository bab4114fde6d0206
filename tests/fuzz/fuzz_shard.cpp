// libFuzzer target: the token-shard reader's validation. The input is the bytes of an .h5 shard
// (seed the corpus with real shards: run_fuzz.sh does); Dataset::open validates header and
// offsets, then every document is read and every token id verified. Rejections must be sb::Error.
#include <cstdint>
#include <cstdio>
#include <exception>

#include "fuzz_io_common.hpp"
#include "io/shard.hpp"
#include "base/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input is a file this program wrote, damaged: one without its whole-file checksum is
  // refused too (files of other tools take libhdf5's path; io/RELIABILITY.md, "Fuzzing").
  static bool once = (sb::h5::quiet_errors(), sb::h5::require_checksums(true), true);
  (void)once;
  const std::string path = sbfuzz::scratch("shard");
  if (!sbfuzz::write_file(path, data, size)) return 0;
  try {
    sb::Dataset ds = sb::Dataset::open(path);
    for (uint64_t d = 0; d < ds.num_docs(); ++d) {
      auto doc = ds.read_doc(d);
      (void)ds.task(d);
      if (doc.size() != ds.doc_length(d)) __builtin_trap();
    }
    ds.verify();
  } catch (const sb::Error&) {
  }
  sbfuzz::end_input(path);
  return 0;
}
