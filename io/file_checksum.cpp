#include "io/file_checksum.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/error.hpp"

namespace sb {

namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                   P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;
constexpr unsigned char kMagic[8] = {'S', 'B', 'S', 'U', 'M', 1, '\r', '\n'};
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

uint64_t rd64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (as the safetensors reader)
}
uint64_t round1(uint64_t acc, uint64_t in) { return std::rotl(acc + in * P2, 31) * P1; }
uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round1(0, v)) * P1 + P4; }

// Bits that differ between the first 8 bytes and the magic: a damaged magic is still ours.
int magic_distance(const unsigned char* p) {
  int d = 0;
  for (int i = 0; i < 8; ++i) d += std::popcount(unsigned(p[i] ^ kMagic[i]));
  return d;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// XXH64 of the file's bytes from `from` to `to`, read in 4 MiB pieces.
uint64_t hash_range(int fd, uint64_t from, uint64_t to, const std::string& path) {
  Xxh64 h;
  std::vector<unsigned char> buf(4u << 20);
  for (uint64_t at = from; at < to;) {
    const ssize_t n = ::pread(fd, buf.data(), size_t(std::min<uint64_t>(buf.size(), to - at)), off_t(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(path + ": read failed while checking the whole-file checksum: " +
                            (n < 0 ? std::strerror(errno) : "the file shrank"));
    h.update(buf.data(), size_t(n));
    at += uint64_t(n);
  }
  return h.digest();
}

}  // namespace

void Xxh64::update(const void* data, size_t n) {
  auto p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (held_ > 0) {
    const size_t take = std::min(n, 32 - held_);
    std::memcpy(buf_ + held_, p, take);
    held_ += take, p += take, n -= take;
    if (held_ < 32) return;
    for (int i = 0; i < 4; ++i) v_[i] = round1(v_[i], rd64(buf_ + 8 * i));
    held_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32)
    for (int i = 0; i < 4; ++i) v_[i] = round1(v_[i], rd64(p + 8 * i));
  std::memcpy(buf_, p, n);
  held_ = n;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
    for (uint64_t v : v_) h = merge(h, v);
  } else {
    h = P5;  // seed 0: v_[2] holds the seed
  }
  h += total_;
  const unsigned char* p = buf_;
  size_t n = held_;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round1(0, rd64(p)), 27) * P1 + P4;
  if (n >= 4) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    h = std::rotl(h ^ (uint64_t(w) * P1), 23) * P2 + P3;
    p += 4, n -= 4;
  }
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (uint64_t(*p) * P5), 11) * P1;
  h ^= h >> 33, h *= P2, h ^= h >> 29, h *= P3, h ^= h >> 32;
  return h;
}

uint64_t xxh64(const void* data, size_t n) {
  Xxh64 h;
  h.update(data, n);
  return h.digest();
}

static void fill_block(uint64_t length, uint64_t sum, unsigned char* block) {
  std::memset(block, 0, kChecksumBlock);
  std::memcpy(block, kMagic, 8);
  std::memcpy(block + 8, &length, 8);
  std::memcpy(block + 16, &sum, 8);
  const uint64_t self = xxh64(block, 24);
  std::memcpy(block + 24, &self, 8);
}

void make_checksum_block(const unsigned char* rest, size_t n, unsigned char* block) {
  fill_block(n, xxh64(rest, n), block);
}

void image_checksum_block(const std::vector<unsigned char>& image, unsigned char* block) {
  if (image.size() < 8 || std::memcmp(image.data(), kHdf5Signature, 8) != 0)
    throw std::logic_error("image_checksum_block: the image does not start with the HDF5 signature");
  make_checksum_block(image.data(), image.size(), block);
}

void stamp_file_checksum(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDWR | O_CLOEXEC)};
  if (f.fd < 0) throw Error(path + ": cannot open to write its checksum: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || uint64_t(st.st_size) < kChecksumBlock)
    throw Error(path + ": too short for its checksum block (was it created with one?)");
  unsigned char head[8];
  if (::pread(f.fd, head, 8, kChecksumBlock) != 8 || std::memcmp(head, kHdf5Signature, 8) != 0)
    throw Error(path + ": no HDF5 signature after a 512-byte user block (not created by h5::create?)");
  unsigned char block[kChecksumBlock];
  fill_block(uint64_t(st.st_size) - kChecksumBlock, hash_range(f.fd, kChecksumBlock, uint64_t(st.st_size), path), block);
  if (::pwrite(f.fd, block, kChecksumBlock, 0) != ssize_t(kChecksumBlock))
    throw Error(path + ": cannot write its checksum: " + std::strerror(errno));
  if (::fsync(f.fd) != 0) throw Error(path + ": fsync failed: " + std::strerror(errno));
}

FileChecksum verify_file_checksum(const std::string& path, bool require) {
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  unsigned char block[kChecksumBlock] = {};
  const ssize_t got = ::pread(f.fd, block, kChecksumBlock, 0);
  const auto damaged = [&](const std::string& why) {
    return Error(path + ": damaged: " + why +
                 " (the file was written by sparsebalance with a whole-file checksum; a bad sector, a partial copy "
                 "or bit rot?); refused before it is read");
  };
  if (got >= 8 && std::memcmp(block, kHdf5Signature, 8) == 0) {
    if (require) throw damaged("its whole-file checksum block is missing");
    return FileChecksum::Absent;  // no user block: an older file or another tool's
  }
  if (got < 8 || magic_distance(block) > 8) {
    if (require) throw damaged("its whole-file checksum block is missing");
    return FileChecksum::Absent;  // not ours: libhdf5 decides what it is
  }
  if (got != ssize_t(kChecksumBlock)) throw damaged("shorter than its 512-byte checksum block");
  uint64_t length, sum, self;
  std::memcpy(&length, block + 8, 8), std::memcpy(&sum, block + 16, 8), std::memcpy(&self, block + 24, 8);
  if (std::memcmp(block, kMagic, 8) != 0 || self != xxh64(block, 24))
    throw damaged("its checksum block (the first 512 bytes) is corrupt");
  for (size_t i = 32; i < kChecksumBlock; ++i)
    if (block[i] != 0) throw damaged("its checksum block (the first 512 bytes) is corrupt");
  if (length != size - kChecksumBlock)
    throw damaged(std::to_string(size) + " bytes, its checksum block says " + std::to_string(length + kChecksumBlock) +
                  (size < length + kChecksumBlock ? " (truncated)" : " (bytes appended)"));
  const uint64_t now = hash_range(f.fd, kChecksumBlock, size, path);
  if (now != sum) {
    char b[128];
    std::snprintf(b, sizeof b, "whole-file checksum mismatch (stored %016llx, the bytes give %016llx)",
                  (unsigned long long)sum, (unsigned long long)now);
    throw damaged(b);
  }
  return FileChecksum::Verified;
}

}  // namespace sb
