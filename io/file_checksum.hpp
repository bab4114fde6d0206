// The whole-file checksum of the HDF5 files the program writes (shards, checkpoints, latency
// profiles): XXH64 over every byte after the file's first 512, stored in those 512 bytes, the HDF5
// "user block" that libhdf5 reserves at the start of a file for its owner and never reads. The
// stamp is written after the file is complete and closed (then fsynced, then the file is renamed
// into place), and verified, at disk speed, before libhdf5 parses a byte of the file: libhdf5 1.10
// trusts the sizes in a file's metadata, and a damaged file (a bad sector, a partial copy, bit rot)
// crashes or hangs it. io/RELIABILITY.md, "Whole-file checksums".
//
// The block (little-endian): "SBSUM\x01\r\n" (8 bytes), the checksummed length (8), XXH64 of the
// bytes after the block (8), the same three fields' XXH64 (8), then zeros to 512.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sb {

inline constexpr size_t kChecksumBlock = 512;  // the user block: HDF5's smallest, a power of two >= 512

// XXH64 (seed 0) of n bytes; a streaming form for files read in pieces.
uint64_t xxh64(const void* data, size_t n);
class Xxh64 {
 public:
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  uint64_t v_[4] = {0x9E3779B185EBCA87ull + 0xC2B2AE3D27D4EB4Full, 0xC2B2AE3D27D4EB4Full, 0,
                    0 - 0x9E3779B185EBCA87ull};
  unsigned char buf_[32] = {};
  size_t held_ = 0;
  uint64_t total_ = 0;
};

// The block for `rest` (the file's bytes after the block), written into `block` (512 bytes).
void make_checksum_block(const unsigned char* rest, size_t n, unsigned char* block);
// The block for a whole file image in memory (the checkpoint writer's, H5Fget_file_image: it
// holds the file from the superblock on, without the user block): the file is the block, then
// the image.
void image_checksum_block(const std::vector<unsigned char>& image, unsigned char* block);
// Stamps a closed file created with a 512-byte user block (h5::create does): hashes the bytes
// after the block, writes the block, fsyncs. Throws naming the file.
void stamp_file_checksum(const std::string& path);

enum class FileChecksum { Verified, Absent };
// Verifies `path` before it is opened by libhdf5. Absent: the file starts with the HDF5 signature
// (written before checksums existed, or by another tool) and takes today's path. Throws naming the
// file when the block is there (or is recognisably ours with damaged bytes) and the file's bytes
// do not match it: length or hash. `require`: an absent block is an error too.
FileChecksum verify_file_checksum(const std::string& path, bool require = false);

}  // namespace sb
