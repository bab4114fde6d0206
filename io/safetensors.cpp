#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/input_file.hpp"

namespace sb {

namespace fs = std::filesystem;
using json = nlohmann::json;
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is this reader");

// safetensors' own reader refuses headers above 100 MB: a larger length is damage, not a model.
static constexpr uint64_t kMaxHeader = 100'000'000;

const char* st_dtype_name(StDtype t) {
  return t == StDtype::F32 ? "F32" : t == StDtype::F16 ? "F16" : "BF16";
}
size_t st_dtype_size(StDtype t) { return t == StDtype::F32 ? 4 : 2; }

StDtype parse_st_dtype(const std::string& s, const std::string& what) {
  if (s == "F32" || s == "f32") return StDtype::F32;
  if (s == "F16" || s == "f16") return StDtype::F16;
  if (s == "BF16" || s == "bf16") return StDtype::BF16;
  throw Error(what + ": dtype '" + s + "' is not supported (expected BF16, F16 or F32)");
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  float v = std::ldexp(float(man), -24);  // subnormal (or zero): exact in float32
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds past 65504: inf
  if (a < 0x38800000u) {  // below the smallest normal 2^-14: subnormal, round to nearest even
    float m = std::fabs(f) * 16777216.0f;  // in units of 2^-24 (exact: a power-of-two scale)
    return uint16_t(sign | uint16_t(std::nearbyint(m)));
  }
  uint32_t v = a - (112u << 23);
  v += 0xfff + ((v >> 13) & 1);
  return uint16_t(sign | (v >> 13));
}

size_t StTensor::numel() const {
  size_t n = 1;
  for (auto d : shape) n *= size_t(d);
  return n;
}

// ---------------------------------------------------------------------------------------------
// Reading

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // The input-file rule (a FIFO would block the open, a directory fails to map naming nothing);
  // checked again on the descriptor, opened without blocking.
  check_input_file(path, "a safetensors file");
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file; expected a safetensors file");
  }
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw Error(path + ": truncated: " + std::to_string(size_) + " bytes, a safetensors file starts with an 8-byte header length");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw Error(path + ": cannot map: " + std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  try {
    uint64_t n = 0;
    std::memcpy(&n, map_, 8);
    if (n > kMaxHeader || n > size_ - 8)
      throw Error(path + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                  std::to_string(size_) + " bytes): truncated or not a safetensors file");
    data_ = map_ + 8 + n;
    const uint64_t data_size = size_ - 8 - n;
    json h;
    try {
      h = json::parse(map_ + 8, map_ + 8 + n);
    } catch (const json::exception& e) {
      throw Error(path + ": the JSON header does not parse: " + e.what());
    }
    if (!h.is_object()) throw Error(path + ": the JSON header must be an object of tensors");
    for (auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) throw Error(path + ": '__metadata__' must be an object of strings");
        for (auto& [k, s] : v.items()) {
          if (!s.is_string()) throw Error(path + ": '__metadata__' entry '" + k + "' must be a string");
          metadata_[k] = s.get<std::string>();
        }
        continue;
      }
      const std::string where = path + ": tensor '" + name + "'";
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
          !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array())
        throw Error(where + ": expected {\"dtype\": string, \"shape\": [..], \"data_offsets\": [begin, end]}");
      StTensor t;
      t.name = name;
      t.dtype = parse_st_dtype(v["dtype"].get<std::string>(), where);
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned()) throw Error(where + ": shape entries must be non-negative integers");
        t.shape.push_back(int64_t(d.get<uint64_t>()));
      }
      const auto& off = v["data_offsets"];
      if (off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw Error(where + ": data_offsets must be two non-negative integers");
      t.begin = off[0].get<uint64_t>(), t.end = off[1].get<uint64_t>();
      if (t.begin > t.end || t.end > data_size)
        throw Error(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                    "] outside the data section of " + std::to_string(data_size) + " bytes (truncated file?)");
      // Overflow-safe: the byte size must match exactly, and every dimension fits in the file.
      uint64_t want = st_dtype_size(t.dtype);
      for (auto d : t.shape) want = d == 0 ? 0 : (want > data_size / uint64_t(d) + 1 ? data_size + 1 : want * uint64_t(d));
      if (want != t.end - t.begin)
        throw Error(where + ": " + std::to_string(t.end - t.begin) + " bytes for dtype " + st_dtype_name(t.dtype) +
                    " and its shape, which needs " + (want > data_size ? "more than the file holds" : std::to_string(want)));
      tensors_.push_back(std::move(t));
    }
    std::vector<const StTensor*> by_begin;
    for (const auto& t : tensors_) by_begin.push_back(&t);
    std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_begin.size(); ++i)
      if (by_begin[i]->begin < by_begin[i - 1]->end)
        throw Error(path + ": tensor '" + by_begin[i]->name + "' overlaps tensor '" + by_begin[i - 1]->name +
                    "' (data_offsets)");
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(map_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::span<const unsigned char> SafetensorsFile::bytes(const StTensor& t) const {
  return {data_ + t.begin, size_t(t.end - t.begin)};
}

void SafetensorsFile::read_f32(const StTensor& t, std::span<float> out) const {
  const size_t n = t.numel();
  if (out.size() != n) throw std::logic_error("SafetensorsFile::read_f32: buffer size differs from the tensor's");
  const unsigned char* p = data_ + t.begin;  // not necessarily aligned: memcpy each value
  if (t.dtype == StDtype::F32) {
    std::memcpy(out.data(), p, n * 4);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = t.dtype == StDtype::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
}

SafetensorsDir::SafetensorsDir(const std::string& dir) : dir_(dir) {
  const fs::path d(dir), index = d / "model.safetensors.index.json", single = d / "model.safetensors";
  std::map<std::string, std::string> want;  // tensor -> shard file, from the index
  if (fs::exists(index)) {
    json j;
    const std::string text = read_input_file(index.string(), "a safetensors index (JSON)", kMaxTextInputBytes);
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(index.string() + ": does not parse as JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": expected an object with a 'weight_map' of tensor -> file");
    for (auto& [name, file] : j["weight_map"].items()) {
      // A plain file name in the directory: not "", ".", ".." (the directory itself or its parent) nor a path.
      const std::string s = file.is_string() ? file.get<std::string>() : "";
      if (!file.is_string() || s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos)
        throw Error(index.string() + ": weight_map entry '" + name + "' is " + file.dump() +
                    ", expected the name of a safetensors file in the directory");
      want[name] = file.get<std::string>();
    }
    std::map<std::string, const SafetensorsFile*> open;
    for (const auto& [name, file] : want)
      if (!open.count(file)) {
        files_.push_back(std::make_unique<SafetensorsFile>((d / file).string()));
        open[file] = files_.back().get();
      }
    for (const auto& [name, file] : want) {
      const SafetensorsFile* f = open[file];
      const StTensor* t = f->find(name);
      if (!t) throw Error(f->path() + ": tensor '" + name + "' is missing (" + index.string() + " places it there)");
      where_[name] = {f, t};
    }
    for (const auto& f : files_)
      for (const auto& t : f->tensors())
        if (!want.count(t.name) || want[t.name] != fs::path(f->path()).filename().string())
          throw Error(f->path() + ": unexpected tensor '" + t.name + "' (not listed for this file in " +
                      index.string() + ")");
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& t : files_.back()->tensors()) where_[t.name] = {files_.back().get(), &t};
  } else {
    throw Error(dir + ": no model.safetensors or model.safetensors.index.json (an HF model directory holds one)");
  }
}

std::vector<std::string> SafetensorsDir::names() const {
  std::vector<std::string> out;
  for (const auto& [n, w] : where_) out.push_back(n);
  return out;
}

std::pair<const SafetensorsFile*, const StTensor*> SafetensorsDir::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    const std::string where = files_.size() == 1 ? files_[0]->path() : (fs::path(dir_) / "model.safetensors.index.json").string();
    throw Error(where + ": tensor '" + name + "' is missing");
  }
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

// A file written under PATH.tmp (or, staged, Staged::tmp_name(PATH)) and renamed onto PATH by
// commit() (staged: left for Staged::commit()); removed if never committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path, Staged* stage = nullptr)
      : path_(std::move(path)), tmp_(stage ? Staged::tmp_name(path_) : path_ + ".tmp"), stage_(stage) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!done_) ::unlink(tmp_.c_str());
  }
  void write(const void* p, size_t n) {
    auto c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw Error(tmp_ + ": write failed: " + std::strerror(w < 0 ? errno : ENOSPC));
      c += w, n -= size_t(w);
    }
  }
  void commit() {
    if (::fsync(fd_) != 0) throw Error(tmp_ + ": fsync failed: " + std::strerror(errno));
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) throw Error(tmp_ + ": close failed: " + std::strerror(errno));
    if (stage_) {
      stage_->add(path_);
      done_ = true;
      return;
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw Error(path_ + ": cannot move into place: " + std::strerror(errno));
    done_ = true;
    fs::path parent = fs::path(path_).parent_path();
    int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) ::fsync(dfd), ::close(dfd);
  }

 private:
  std::string path_, tmp_;
  Staged* stage_;
  int fd_ = -1;
  bool done_ = false;
};

}  // namespace

std::string Staged::tmp_name(const std::string& path) {
  const fs::path p(path);
  std::string name = ".";  // hidden, beside the final name
  name += p.filename().string();
  name += ".sbtmp";
  return (p.parent_path() / name).string();
}

void Staged::add(const std::string& path) { paths_.push_back(path); }

void Staged::commit() {
  for (const auto& p : paths_)
    if (std::rename(tmp_name(p).c_str(), p.c_str()) != 0)
      throw Error(p + ": cannot move into place: " + std::strerror(errno));
  committed_ = true;
  for (const auto& p : paths_) {
    const fs::path parent = fs::path(p).parent_path();
    int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) ::fsync(dfd), ::close(dfd);
  }
}

Staged::~Staged() {
  if (committed_) return;
  for (const auto& p : paths_) ::unlink(tmp_name(p).c_str());
}

std::vector<std::string> indexed_shards(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::is_regular_file(index, ec)) return {};
  std::vector<std::string> out;
  try {
    const json j = json::parse(read_input_file(index.string(), "a safetensors index (JSON)", kMaxTextInputBytes));
    for (auto& [name, file] : j.at("weight_map").items())
      if (file.is_string() && std::find(out.begin(), out.end(), file.get<std::string>()) == out.end())
        out.push_back(file.get<std::string>());
  } catch (const std::exception&) {
    return {};
  }
  return out;
}

void write_text_file(const std::string& path, const std::string& text, Staged* stage) {
  AtomicFile f(path, stage);
  f.write(text.data(), text.size());
  f.commit();
}

void write_safetensors(const std::string& path, const std::vector<StOut>& tensors, StDtype dtype, Staged* stage) {
  const size_t es = st_dtype_size(dtype);
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};  // transformers refuses a file without it
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (auto d : t.shape) n *= uint64_t(d);
    if (n != t.data.size()) throw std::logic_error("write_safetensors: shape and data of '" + t.name + "' differ");
    h[t.name] = {{"dtype", st_dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n * es}}};
    off += n * es;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data section 8-byte aligned, as safetensors pads it
  const uint64_t n = header.size();
  AtomicFile f(path, stage);
  f.write(&n, 8);
  f.write(header.data(), header.size());
  std::vector<uint16_t> buf;
  for (const auto& t : tensors) {  // in `tensors` order, as the offsets say (the header's keys come sorted)
    if (dtype == StDtype::F32) {
      f.write(t.data.data(), t.data.size() * 4);
      continue;
    }
    buf.resize(t.data.size());
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = dtype == StDtype::BF16 ? f32_to_bf16(t.data[i]) : f32_to_f16(t.data[i]);
    f.write(buf.data(), buf.size() * 2);
  }
  f.commit();
}

std::vector<std::string> write_safetensors_dir(const std::string& dir, const std::vector<StOut>& tensors,
                                               StDtype dtype, uint64_t shard_bytes, Staged* stage) {
  std::vector<std::vector<StOut>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    const uint64_t b = t.data.size() * st_dtype_size(dtype);
    if (in_shard > 0 && in_shard + b > shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(t);
    in_shard += b, total += b;
  }
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, dtype, stage);
    return {"model.safetensors"};
  }
  std::vector<std::string> names;
  json map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((fs::path(dir) / name).string(), shards[i], dtype, stage);
    for (const auto& t : shards[i]) map[t.name] = name;
    names.push_back(name);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  write_text_file((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n", stage);
  names.push_back("model.safetensors.index.json");
  return names;
}

}  // namespace sb
