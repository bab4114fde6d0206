// safetensors files (Hugging Face's weight format): an 8-byte little-endian header length N, N
// bytes of JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {..}}, then the raw little-endian tensor bytes (offsets count from there).
//
// Reading maps the file (mmap) and converts one tensor at a time into the caller's float buffer,
// so a model is never in memory twice. The header is checked completely when a file is opened:
// every error names the file and, where there is one, the tensor. A model directory is one
// model.safetensors or shards listed by model.safetensors.index.json.
//
// Writing goes to a temporary name, is fsynced and renamed; above `shard_bytes` the tensors are
// split into model-0000i-of-0000n.safetensors with an index, as save_pretrained does.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/bf16.hpp"

namespace sb {

enum class StDtype { F32, F16, BF16 };
const char* st_dtype_name(StDtype t);  // "F32", "F16", "BF16"
size_t st_dtype_size(StDtype t);
// "bf16" | "f16" | "f32" (the --dtype flag) or the header's "BF16" | "F16" | "F32"; throws naming `what`.
StDtype parse_st_dtype(const std::string& s, const std::string& what);

// Exact widening, and round-to-nearest-even narrowing (exact for values that came from the type);
// bf16's pair is base/bf16.hpp's bf16_to_f32 / f32_to_bf16.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

struct StTensor {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
  size_t numel() const;
};

// One mapped file. Opening validates the whole header (truncation, header length, JSON, dtypes,
// shape against byte size, offsets in range and not overlapping).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const StTensor* find(const std::string& name) const;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's raw bytes (little-endian, as stored).
  std::span<const unsigned char> bytes(const StTensor& t) const;
  // Converted to float32; `out` must hold numel() values.
  void read_f32(const StTensor& t, std::span<float> out) const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  const unsigned char* data_ = nullptr;  // the data section
  std::vector<StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The safetensors of an HF model directory: model.safetensors, or the shards named by
// model.safetensors.index.json (every tensor of the index must be in its shard, and every tensor
// of a shard in the index).
class SafetensorsDir {
 public:
  explicit SafetensorsDir(const std::string& dir);
  // Names of all tensors, sorted.
  std::vector<std::string> names() const;
  // The file holding `name` and its entry; throws naming the directory when absent.
  std::pair<const SafetensorsFile*, const StTensor*> get(const std::string& name) const;
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const StTensor*>> where_;
};

// A float32 tensor to write.
struct StOut {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;
};

inline constexpr uint64_t kDefaultShardBytes = 5'000'000'000ull;  // save_pretrained's "5GB"

// Files written together that go into place together (an export into a directory the user owns):
// each is written under a hidden temporary name beside its final one (".NAME.sbtmp"), fsynced and
// closed; commit() renames them all into place and fsyncs the directory. Until commit() nothing
// under a final name has changed; destroyed before commit(), the temporaries are removed.
class Staged {
 public:
  Staged() = default;
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  ~Staged();
  void add(const std::string& path);  // written and synced under tmp_name(path)
  void commit();
  const std::vector<std::string>& paths() const { return paths_; }
  static std::string tmp_name(const std::string& path);

 private:
  std::vector<std::string> paths_;
  bool committed_ = false;
};

// One file (temporary name, fsync, rename), values converted to `dtype`; metadata {"format": "pt"}.
// With `stage`, the file is left under its temporary name for stage->commit().
void write_safetensors(const std::string& path, const std::vector<StOut>& tensors, StDtype dtype,
                       Staged* stage = nullptr);
// Into directory `dir` (must exist): model.safetensors when all tensors fit in `shard_bytes`,
// otherwise shards in order, each at most shard_bytes unless one tensor alone is larger, and
// model.safetensors.index.json. Returns the file names written.
std::vector<std::string> write_safetensors_dir(const std::string& dir, const std::vector<StOut>& tensors,
                                               StDtype dtype, uint64_t shard_bytes = kDefaultShardBytes,
                                               Staged* stage = nullptr);
// The shard names model.safetensors.index.json in `dir` lists (its weight_map's files), or none
// when there is no index or it does not parse: the files a previous export wrote there.
std::vector<std::string> indexed_shards(const std::string& dir);

// Text to a file: temporary name, fsync, rename (config.json, the index); or staged.
void write_text_file(const std::string& path, const std::string& text, Staged* stage = nullptr);

}  // namespace sb
