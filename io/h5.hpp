// RAII for HDF5 ids and a few checked helpers used by every format in io/ (shards, checkpoints,
// logs, latency profiles). Calls go straight to the HDF5 C API; H5_CHECK names file and line.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"

// HDF5: negative ids/status are failures (sb::Error naming the call and the source line).
#define H5_CHECK(call)                                                                \
  ([&]() {                                                                            \
    auto sb_rc_ = (call);                                                             \
    if (sb_rc_ < 0) ::sb::fail_call("HDF5", #call, __FILE__, __LINE__);               \
    return sb_rc_;                                                                    \
  }())

namespace sb::h5 {

// Owns one HDF5 id and closes it with the right H5*close.
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  ~Id() { reset(); }
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) reset(), id_ = std::exchange(o.id_, H5I_INVALID_HID);
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turn off HDF5's automatic error-stack printing: failures are reported as sb::Error with
// the file and object named, which is what a user needs (once per process).
void quiet_errors();

// What every HDF5 open of a user's path runs first: the input-file rule (base/input_file.hpp: a
// regular file, not a FIFO, directory or device) and the whole-file checksum of the files the
// program writes (io/file_checksum.hpp). `expected` says what the caller reads, e.g. "a checkpoint".
// Throws naming the file. Reads the whole file once: a reader runs it once per file.
void check_file(const std::string& path, const std::string& expected);
// Testing aid (the fuzz targets: "a file this program wrote, damaged"): a file without the
// whole-file checksum block is refused too.
void require_checksums(bool on);
// Open a file read-only after check_file; error names the path when it is missing or not HDF5.
Id open_read(const std::string& path, const std::string& expected = "an HDF5 file");
// The same, for a caller that ran check_file itself (or whose rank 0 did, for every rank).
Id open_read_checked(const std::string& path);
// Create (truncate) a file, with the 512-byte user block its whole-file checksum goes into
// (stamp_file_checksum once it is closed).
Id create(const std::string& path);
// The file-creation properties of create(): a 512-byte user block.
Id create_plist();

bool exists(hid_t loc, const std::string& path);  // link exists (intermediate groups checked)
Id group(hid_t loc, const std::string& name, bool create_missing);

// Attributes (scalar) on any object.
void write_attr(hid_t obj, const std::string& name, const std::string& value);
void write_attr(hid_t obj, const std::string& name, int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);
bool has_attr(hid_t obj, const std::string& name);
// The read_* helpers throw sb::Error "<file>: attribute '<name>' ..." with `file` for context.
std::string read_attr_string(hid_t obj, const std::string& name, const std::string& file);
int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& file);
double read_attr_double(hid_t obj, const std::string& name, const std::string& file);
// Every SparseBalance file (and the latency group) carries `format` and `version` attributes.
// Throws "<file>: ... attribute 'format' ..." (naming `what`, e.g. "a shard") or "... 'version'
// is N, expected V ..." when they are missing or differ.
void check_format(hid_t obj, const std::string& file, const std::string& format, int64_t version,
                  const std::string& what);

// Whole 1-D (or n-D, flattened) datasets of a native type.
template <class T>
hid_t native_type();
template <class T>
void write_vector(hid_t loc, const std::string& name, const std::vector<T>& data,
                  const std::vector<hsize_t>& dims = {});
// Reads a dataset whose class/size must match T exactly and whose element count must be
// `expect` (or any count when expect < 0); errors name the file and the dataset.
template <class T>
std::vector<T> read_vector(hid_t loc, const std::string& name, const std::string& file,
                           int64_t expect = -1, std::vector<hsize_t>* dims = nullptr);

// The checks of read_vector without the read: the open dataset; its shape and element count.
template <class T>
Id open_dataset(hid_t loc, const std::string& name, const std::string& file, int64_t expect,
                std::vector<hsize_t>* dims = nullptr, hsize_t* count = nullptr);

}  // namespace sb::h5
