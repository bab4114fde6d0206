// The input-file rule (io/RELIABILITY.md, "Input files"): every file the program reads from a path a
// user gave (a config, a config.json, a safetensors file or index, a tokenizer, a profile, a shard,
// a checkpoint, a dictionary) is checked here before it is opened. It must be a regular file: a FIFO
// blocks an open or a read forever (and a job blocked there answers no SIGTERM), a directory reads
// as empty or fails with an errno that names nothing, a device such as /dev/zero never ends. Where
// a size bound makes sense (text read whole into memory) the caller gives it.
#pragma once
#include <cstdint>
#include <string>

namespace sb {

// Throws sb::Error "<path>: <why>; expected <expected>" when `path` is missing, is not a regular
// file, or (max_bytes > 0) is larger than max_bytes. `expected` says what the caller reads there,
// e.g. "an HF config.json" or "a tokenizer.json (--tokenizer)".
void check_input_file(const std::string& path, const std::string& expected, uint64_t max_bytes = 0);

// The whole file as bytes, after the checks above; opened with O_NONBLOCK and checked again on the
// open descriptor, so a path swapped for a FIFO between the check and the open cannot block either.
std::string read_input_file(const std::string& path, const std::string& expected, uint64_t max_bytes);

// What a text file read whole may hold unless its reader knows better (a tokenizer.json of a
// 256K vocabulary is ~20 MB; a config.json, index or profile is kilobytes).
inline constexpr uint64_t kMaxTextInputBytes = 1ull << 30;

}  // namespace sb
