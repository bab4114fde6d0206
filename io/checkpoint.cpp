#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>

#include "base/error.hpp"
#include "base/hash.hpp"
#include "io/checkpoint_layout.hpp"
#include "io/file_checksum.hpp"
#include "io/h5.hpp"

namespace sb {

namespace fs = std::filesystem;

// Over everything a resume depends on, so a flipped bit anywhere in the state is caught: the
// scalars and config (checksum_head), then the bytes of params, m and v in flat order.
uint64_t checksum_head(const Checkpoint& ck) {
  uint64_t h = fnv1a(&ck.step, sizeof ck.step);
  h = fnv1a(&ck.data_epoch, sizeof ck.data_epoch, h);
  h = fnv1a(&ck.data_cursor, sizeof ck.data_cursor, h);
  if (!ck.source_epochs.empty()) {  // a mixture's cursor (nothing for data.path: older checksums hold)
    h = fnv1a(ck.source_epochs.data(), ck.source_epochs.size() * sizeof(int64_t), h);
    h = fnv1a(ck.source_indexes.data(), ck.source_indexes.size() * sizeof(int64_t), h);
    h = fnv1a(&ck.data_draws, sizeof ck.data_draws, h);
  }
  return fnv1a(ck.config_toml.data(), ck.config_toml.size(), h);
}

static uint64_t checksum(const Checkpoint& ck) {
  uint64_t h = checksum_head(ck);
  for (const auto* buf : {&ck.params, &ck.m, &ck.v}) h = fnv1a(buf->data(), buf->size() * sizeof(float), h);
  return h;
}

// The datasets the trainer adds (/latency/*, /recall/alpha, ...): everything but /params, /optim
// and the text ones, which checksum() covers. Numeric datasets only, by sorted name: their names,
// shapes and values. Stored as attribute 'checksum_extra'; a checkpoint without it (written before
// it existed) still reads, its extra groups then checked by their values only.
static herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  const std::string n = name;
  if (info->type == H5O_TYPE_DATASET && !n.starts_with("params/") && !n.starts_with("optim/") && n != "config" &&
      n != "param_names")
    static_cast<std::vector<std::string>*>(out)->push_back(n);
  return 0;
}

uint64_t checksum_extra(hid_t f, const std::string& file) {
  std::vector<std::string> names;
  H5_CHECK(H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names));
  std::sort(names.begin(), names.end());
  hsize_t fsize = 0;
  H5_CHECK(H5Fget_filesize(f, &fsize));
  uint64_t h = fnv1a("extra", 5);
  for (const auto& name : names) {
    h5::Id ds(H5_CHECK(H5Dopen2(f, name.c_str(), H5P_DEFAULT)));
    h5::Id type(H5_CHECK(H5Dget_type(ds)));
    const H5T_class_t cls = H5Tget_class(type);
    if (cls != H5T_INTEGER && cls != H5T_FLOAT) continue;
    h5::Id mem(H5_CHECK(H5Tget_native_type(type, H5T_DIR_ASCEND)));
    h5::Id space(H5_CHECK(H5Dget_space(ds)));
    const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
    std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
    H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
    hsize_t bytes = H5Tget_size(mem);
    for (auto d : dims)
      if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > fsize + 1024)
        throw Error(file + ": dataset '" + name + "' claims more data than the file holds (truncated or corrupt?)");
    std::vector<unsigned char> buf(bytes);
    if (bytes && H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
      throw Error(file + ": cannot read dataset '" + name + "' (truncated or corrupt?)");
    h = fnv1a(name.data(), name.size(), h);
    h = fnv1a(dims.data(), dims.size() * sizeof(hsize_t), h);
    h = fnv1a(buf.data(), buf.size(), h);
  }
  return h;
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt_%08lld.h5", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

// Text as a scalar variable-length UTF-8 string dataset (h5py gives str; h5dump prints it).
void write_text(hid_t loc, const std::string& name, const std::string& text) {
  h5::Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  h5::Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  h5::Id ds(H5_CHECK(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  const char* p = text.c_str();
  H5_CHECK(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p));
}

// libhdf5 1.10 trusts the sizes stored in a global heap collection when it reads a variable-length
// string: a corrupt file makes H5Dread copy or allocate hundreds of MB past the heap (found by
// tests/fuzz/fuzz_checkpoint). Before reading, check the string's heap object the way HDF5 lays it
// out (contiguous scalar: 4-byte length, heap address, 4-byte index -> "GCOL" collection whose
// objects must all lie inside it). Throws naming the dataset when anything is out of bounds.
static void check_vlen_heap(hid_t ds, const std::string& name, const std::string& file) {
  auto bad = [&](const std::string& why) {
    return Error(file + ": dataset '" + name + "' is corrupt (" + why + ")");
  };
  h5::Id dcpl(H5_CHECK(H5Dget_create_plist(ds)));
  if (H5Pget_layout(dcpl) != H5D_CONTIGUOUS) throw bad("expected contiguous layout");
  haddr_t at = H5Dget_offset(ds);
  if (at == HADDR_UNDEF) throw bad("no data stored");
  h5::Id fid(H5_CHECK(H5Iget_file_id(ds)));
  h5::Id fcpl(H5_CHECK(H5Fget_create_plist(fid)));
  size_t sa = 0, ss = 0;
  hsize_t ub = 0, fsize = 0;
  H5_CHECK(H5Pget_sizes(fcpl, &sa, &ss));
  H5_CHECK(H5Pget_userblock(fcpl, &ub));
  H5_CHECK(H5Fget_filesize(fid, &fsize));
  if (sa < 2 || sa > 8 || ss < 2 || ss > 8) throw bad("unsupported address/length sizes");
  std::FILE* fp = std::fopen(file.c_str(), "rb");
  if (!fp) throw Error(file + ": cannot open");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(fp, std::fclose);
  const uint64_t disk = uint64_t(std::filesystem::file_size(file));
  auto read_at = [&](uint64_t off, void* buf, size_t n) {
    if (off > disk || n > disk - off || std::fseek(fp, long(off), SEEK_SET) != 0 || std::fread(buf, 1, n, fp) != n)
      throw bad("heap data beyond the end of the file");
  };
  auto le = [](const unsigned char* p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
  };
  unsigned char d[24];
  read_at(at, d, 4 + sa + 4);  // H5Dget_offset is absolute (user block included); heap addresses are not
  const uint64_t len = le(d, 4), heap = le(d + 4, sa), index = le(d + 4 + sa, 4);
  if (len == 0) return;  // empty string: HDF5 reads nothing from the heap
  unsigned char h[16];
  read_at(ub + heap, h, 8 + ss);
  if (std::memcmp(h, "GCOL", 4) != 0) throw bad("global heap signature missing");
  const uint64_t csize = le(h + 8, ss);
  if (csize < 8 + ss || csize > fsize || heap + csize > fsize) throw bad("global heap collection out of bounds");
  std::vector<unsigned char> col(csize);
  read_at(ub + heap, col.data(), csize);
  bool found = false;
  for (uint64_t p = 8 + ss; p + 8 + ss <= csize;) {
    const uint64_t idx = le(&col[p], 2), osize = le(&col[p + 8], ss);
    if (idx == 0) break;  // free space: the rest of the collection
    const uint64_t padded = (osize + 7) / 8 * 8;
    if (osize > csize || padded > csize - (p + 8 + ss)) throw bad("global heap object larger than its collection");
    if (idx == index) {
      if (len > osize) throw bad("string longer than its heap object");
      found = true;
    }
    p += 8 + ss + padded;
  }
  if (!found) throw bad("heap object of the string not found");
}

std::string read_text(hid_t loc, const std::string& name, const std::string& file) {
  if (!h5::exists(loc, name)) throw Error(file + ": missing dataset '" + name + "'");
  h5::Id ds(H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  h5::Id type(H5_CHECK(H5Dget_type(ds)));
  h5::Id space(H5_CHECK(H5Dget_space(ds)));
  if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) <= 0 ||
      H5Sget_simple_extent_type(space) != H5S_SCALAR)
    throw Error(file + ": dataset '" + name + "' must be a scalar variable-length string");
  check_vlen_heap(ds, name, file);
  h5::Id mem(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(mem, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(mem, H5Tget_cset(type)));
  char* p = nullptr;
  if (H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p) < 0 || !p)
    throw Error(file + ": cannot read dataset '" + name + "' (truncated or corrupt?)");
  std::string out = p;
  H5free_memory(p);
  return out;
}

void fsync_path(const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open for fsync");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(path + ": fsync failed");
}

// Whole file, then fsync; errors carry errno's text (e.g. "No space left on device").
static void write_file_synced(const std::string& p, std::initializer_list<std::span<const unsigned char>> parts) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(p + ": cannot create: " + std::strerror(errno));
  size_t total = 0, done = 0;
  for (const auto& data : parts) total += data.size();
  for (const auto& data : parts)
    for (size_t at = 0; at < data.size();) {
      ssize_t w = ::write(fd, data.data() + at, data.size() - at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        int e = w < 0 ? errno : ENOSPC;
        ::close(fd);
        throw Error(p + ": write failed after " + std::to_string(done) + " of " + std::to_string(total) +
                    " bytes: " + std::strerror(e));
      }
      at += size_t(w), done += size_t(w);
    }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(p + ": fsync failed: " + std::strerror(e));
  }
  if (::close(fd) != 0) throw Error(p + ": close failed: " + std::strerror(errno));
}

void write_meta(hid_t f, const Checkpoint& ck, size_t num_params, uint64_t sum) {
  h5::write_attr(f, "format", std::string(kCheckpointFormat));
  h5::write_attr(f, "version", int64_t(kCheckpointVersion));
  h5::write_attr(f, "step", ck.step);
  h5::write_attr(f, "ranks", ck.ranks);
  h5::write_attr(f, "num_params", int64_t(num_params));
  h5::write_attr(f, "checksum", std::to_string(sum));
  write_text(f, "config", ck.config_toml);
  std::string names;
  for (const auto& t : ck.tensors) names += t.name + "\n";
  write_text(f, "param_names", names);  // the order the flat buffers and the checksum use
  h5::Id st = h5::group(f, "state", true);
  h5::write_attr(st, "data_epoch", ck.data_epoch);
  h5::write_attr(st, "data_cursor", ck.data_cursor);
  h5::write_attr(st, "skipped_steps", ck.skipped_steps);
  if (!ck.source_epochs.empty()) {
    h5::write_vector(st, "source_epoch", ck.source_epochs);
    h5::write_vector(st, "source_index", ck.source_indexes);
    h5::write_attr(st, "data_draws", ck.data_draws);
  }
}

void write_checkpoint(const std::string& path, const Checkpoint& ck, const std::function<void(hid_t)>& extra) {
  fs::path p(path);
  std::error_code ec;
  // Checked before anything is created: "x.h5/" would make a directory x.h5 and fail at the rename.
  if (path.empty() || !p.has_filename() || p.filename() == "." || p.filename() == ".." || fs::is_directory(p, ec))
    throw Error(path + ": names a directory; a checkpoint path names a file (e.g. " +
                (p.has_filename() ? path + "/ckpt.h5" : fs::path(path).parent_path().string()) + ")");
  ec.clear();  // is_directory set it for a path that does not exist yet: a bare "ck.h5" has no directory to make
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec) throw Error(path + ": cannot create checkpoint directory: " + ec.message());
  const std::string tmp = path + ".tmp";
  try {
    // Built in memory (HDF5 core driver, no backing store), then written with plain POSIX calls:
    // a full or failing disk gives a clean errno here, and libhdf5 never holds a half-written file
    // (after a failed flush on a full disk it kept the file open and crashed in MPI_Finalize).
    h5::quiet_errors();
    std::vector<unsigned char> image;
    h5::Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
    H5_CHECK(H5Pset_fapl_core(fapl, 1 << 20, 0));
    h5::Id fcpl = h5::create_plist();  // the user block the whole-file checksum goes into
    hid_t fid = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl, fapl);
    if (fid < 0) throw Error(tmp + ": cannot create the checkpoint image in memory");
    h5::Id f(fid);
    write_meta(f, ck, ck.params.size(), checksum(ck));
    h5::Id params = h5::group(f, "params", true), mg = h5::group(f, "optim/m", true),
           vg = h5::group(f, "optim/v", true);
    for (const auto& t : ck.tensors) {
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      auto slice = [&](const std::vector<float>& buf) {
        return std::vector<float>(buf.begin() + t.offset, buf.begin() + t.offset + t.size);
      };
      h5::write_vector(params, t.name, slice(ck.params), dims);
      h5::write_vector(mg, t.name, slice(ck.m), dims);
      h5::write_vector(vg, t.name, slice(ck.v), dims);
    }
    if (extra) extra(f);
    h5::write_attr(f, "checksum_extra", std::to_string(checksum_extra(f, tmp)));
    if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) throw Error(tmp + ": flush failed");
    ssize_t n = H5Fget_file_image(f, nullptr, 0);
    if (n <= 0) throw Error(tmp + ": cannot get the checkpoint image");
    image.resize(size_t(n));
    if (H5Fget_file_image(f, image.data(), size_t(n)) != n) throw Error(tmp + ": cannot get the checkpoint image");
    f.reset();
    unsigned char block[kChecksumBlock];  // the user block the image leaves out: the whole-file checksum
    image_checksum_block(image, block);
    write_file_synced(tmp, {{block, kChecksumBlock}, {image.data(), image.size()}});
  } catch (const std::exception& e) {
    fs::remove(tmp, ec);
    throw Error(path + ": checkpoint write failed, previous checkpoints untouched: " + e.what());
  }
  fs::rename(tmp, p, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(path + ": cannot move the checkpoint into place: " + ec.message());
  }
  fsync_path(p.has_parent_path() ? p.parent_path().string() : ".", true);
}

Checkpoint read_meta(hid_t f, const std::string& path) {
  Checkpoint ck;
  h5::check_format(f, path, kCheckpointFormat, kCheckpointVersion, "a checkpoint");
  ck.step = h5::read_attr_int(f, "step", path);
  ck.ranks = h5::read_attr_int(f, "ranks", path);
  ck.config_toml = read_text(f, "config", path);
  h5::Id st = h5::group(f, "state", false);
  ck.data_epoch = h5::read_attr_int(st, "data_epoch", path);
  ck.data_cursor = h5::read_attr_int(st, "data_cursor", path);
  ck.skipped_steps = h5::read_attr_int(st, "skipped_steps", path);
  if (h5::exists(st, "source_epoch")) {
    ck.source_epochs = h5::read_vector<int64_t>(st, "source_epoch", path);
    ck.source_indexes = h5::read_vector<int64_t>(st, "source_index", path, int64_t(ck.source_epochs.size()));
    ck.data_draws = h5::read_attr_int(st, "data_draws", path);
  }
  const auto negative = [](const std::vector<int64_t>& v) { return std::any_of(v.begin(), v.end(), [](int64_t x) { return x < 0; }); };
  if (ck.step < 0 || ck.data_epoch < 0 || ck.data_cursor < 0 || ck.data_draws < 0 || negative(ck.source_epochs) ||
      negative(ck.source_indexes))
    throw Error(path + ": negative step or data cursor in the checkpoint");
  std::string names = read_text(f, "param_names", path);
  for (size_t a = 0, b; (b = names.find('\n', a)) != std::string::npos; a = b + 1)
    ck.tensors.push_back({names.substr(a, b - a), {}, 0, 0});
  return ck;
}

size_t read_shapes(hid_t f, Checkpoint& ck, const std::string& path) {
  size_t off = 0;
  for (auto& t : ck.tensors) {
    std::vector<hsize_t> dims;
    hsize_t n = 0;
    h5::open_dataset<float>(f, "params/" + t.name, path, -1, &dims, &n);
    t.shape.assign(dims.begin(), dims.end());
    t.offset = off, t.size = size_t(n);
    off += t.size;
    h5::open_dataset<float>(f, "optim/m/" + t.name, path, int64_t(t.size));
    h5::open_dataset<float>(f, "optim/v/" + t.name, path, int64_t(t.size));
  }
  if (int64_t(off) != h5::read_attr_int(f, "num_params", path))
    throw Error(path + ": parameters add up to " + std::to_string(off) + " values, attribute 'num_params' says " +
                std::to_string(h5::read_attr_int(f, "num_params", path)));
  return off;
}

void verify_checksums(hid_t f, const std::string& path, uint64_t sum) {
  std::string want = h5::read_attr_string(f, "checksum", path);
  if (std::to_string(sum) != want)
    throw Error(path + ": checksum mismatch (stored " + want + ", contents give " + std::to_string(sum) +
                "): the checkpoint is corrupt");
  if (h5::has_attr(f, "checksum_extra")) {
    const std::string stored = h5::read_attr_string(f, "checksum_extra", path);
    const std::string extra_sum = std::to_string(checksum_extra(f, path));
    if (stored != extra_sum)
      throw Error(path + ": checksum mismatch in /latency, /recall or another added group (stored " + stored +
                  ", contents give " + extra_sum + "): the checkpoint is corrupt");
  }
}

Checkpoint read_checkpoint(const std::string& path, const std::function<void(hid_t)>& extra) {
  h5::Id f = h5::open_read(path, "a checkpoint");  // the input-file rule and the whole-file checksum
  Checkpoint ck = read_meta(f, path);
  read_shapes(f, ck, path);  // no reserve from the claimed sizes: a corrupt file may claim anything
  for (const auto& t : ck.tensors)
    for (const char* g : {"params/", "optim/m/", "optim/v/"}) {
      auto x = h5::read_vector<float>(f, g + t.name, path, int64_t(t.size));
      auto& buf = g[0] == 'p' ? ck.params : g[6] == 'm' ? ck.m : ck.v;
      buf.insert(buf.end(), x.begin(), x.end());
    }
  verify_checksums(f, path, checksum(ck));
  if (extra) extra(f);
  return ck;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<long long, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    long long step = 0;
    char tail[8] = {0};
    if (std::sscanf(name.c_str(), "ckpt_%lld.h%2s", &step, tail) == 2 && name == fs::path(checkpoint_path(dir, step)).filename().string())
      found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(p);
  return out;
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  auto all = list_checkpoints(dir);
  std::error_code ec;
  for (size_t i = size_t(std::max<int64_t>(keep, 1)); i < all.size(); ++i) fs::remove(all[i], ec);
}

}  // namespace sb
