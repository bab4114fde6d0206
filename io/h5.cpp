#include "io/h5.hpp"

#include <filesystem>
#include <sstream>

#include "base/input_file.hpp"
#include "io/file_checksum.hpp"

namespace sb::h5 {

void Id::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

void quiet_errors() {
  static bool done = false;
  if (!done) H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr), done = true;
}

static bool g_require_checksums = false;
void require_checksums(bool on) { g_require_checksums = on; }

void check_file(const std::string& path, const std::string& expected) {
  check_input_file(path, expected);
  verify_file_checksum(path, g_require_checksums);
}

Id open_read(const std::string& path, const std::string& expected) {
  quiet_errors();
  check_file(path, expected);
  return open_read_checked(path);
}

Id open_read_checked(const std::string& path) {
  quiet_errors();
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw Error(path + ": not a readable HDF5 file (truncated or corrupt?)");
  return Id(f);
}

Id create_plist() {
  Id fcpl(H5_CHECK(H5Pcreate(H5P_FILE_CREATE)));
  H5_CHECK(H5Pset_userblock(fcpl, kChecksumBlock));
  return fcpl;
}

Id create(const std::string& path) {
  quiet_errors();
  Id fcpl = create_plist();
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
  if (f < 0) throw Error(path + ": cannot create HDF5 file (directory missing or not writable?)");
  return Id(f);
}

bool exists(hid_t loc, const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '/');) {
    if (part.empty()) continue;
    cur += (cur.empty() ? "" : "/") + part;
    if (H5Lexists(loc, cur.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

Id group(hid_t loc, const std::string& name, bool create_missing) {
  if (exists(loc, name)) return Id(H5_CHECK(H5Gopen2(loc, name.c_str(), H5P_DEFAULT)));
  if (!create_missing) throw Error("missing HDF5 group '" + name + "'");
  Id lcpl(H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  return Id(H5_CHECK(H5Gcreate2(loc, name.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT)));
}

static void write_attr_raw(hid_t obj, const std::string& name, hid_t type, const void* data) {
  if (H5Aexists(obj, name.c_str()) > 0) H5_CHECK(H5Adelete(obj, name.c_str()));
  Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  Id attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(attr, type, data));
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  // Variable-length UTF-8: h5py reads it as str, h5dump prints it plainly.
  Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  const char* p = value.c_str();
  write_attr_raw(obj, name, type, &p);
}
void write_attr(hid_t obj, const std::string& name, int64_t value) {
  write_attr_raw(obj, name, H5T_NATIVE_INT64, &value);
}
void write_attr(hid_t obj, const std::string& name, double value) {
  write_attr_raw(obj, name, H5T_NATIVE_DOUBLE, &value);
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

void check_format(hid_t obj, const std::string& file, const std::string& format, int64_t version,
                  const std::string& what) {
  if (!has_attr(obj, "format"))
    throw Error(file + ": missing attribute 'format' (expected format=\"" + format + "\"; not " + what + "?)");
  const std::string got = read_attr_string(obj, "format", file);
  if (got != format)
    throw Error(file + ": attribute 'format' is \"" + got + "\", expected \"" + format + "\" (not " + what + ")");
  const int64_t v = read_attr_int(obj, "version", file);
  if (v != version)
    throw Error(file + ": attribute 'version' is " + std::to_string(v) + ", expected " + std::to_string(version) +
                " (written by another SparseBalance version?)");
}

static Id open_attr(hid_t obj, const std::string& name, const std::string& file) {
  if (!has_attr(obj, name)) throw Error(file + ": missing attribute '" + name + "'");
  return Id(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
}

std::string read_attr_string(hid_t obj, const std::string& name, const std::string& file) {
  Id attr = open_attr(obj, name, file);
  Id type(H5_CHECK(H5Aget_type(attr)));
  if (H5Tget_class(type) != H5T_STRING) throw Error(file + ": attribute '" + name + "' must be a string");
  if (H5Tis_variable_str(type) > 0) {
    Id mem(H5_CHECK(H5Tcopy(H5T_C_S1)));
    H5_CHECK(H5Tset_size(mem, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(mem, H5Tget_cset(type)));
    char* s = nullptr;
    H5_CHECK(H5Aread(attr, mem, &s));
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  size_t n = H5Tget_size(type);
  std::string out(n, '\0');
  Id mem(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(mem, n));
  H5_CHECK(H5Tset_strpad(mem, H5T_STR_NULLPAD));
  H5_CHECK(H5Aread(attr, mem, out.data()));
  out.resize(out.find('\0') == std::string::npos ? n : out.find('\0'));
  return out;
}

int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& file) {
  Id attr = open_attr(obj, name, file);
  Id type(H5_CHECK(H5Aget_type(attr)));
  if (H5Tget_class(type) != H5T_INTEGER) throw Error(file + ": attribute '" + name + "' must be an integer");
  int64_t v = 0;
  H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v));
  return v;
}

double read_attr_double(hid_t obj, const std::string& name, const std::string& file) {
  Id attr = open_attr(obj, name, file);
  Id type(H5_CHECK(H5Aget_type(attr)));
  auto cls = H5Tget_class(type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) throw Error(file + ": attribute '" + name + "' must be a number");
  double v = 0;
  H5_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, &v));
  return v;
}

template <> hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }
template <> hid_t native_type<double>() { return H5T_NATIVE_DOUBLE; }
template <> hid_t native_type<int32_t>() { return H5T_NATIVE_INT32; }
template <> hid_t native_type<int64_t>() { return H5T_NATIVE_INT64; }
template <> hid_t native_type<uint8_t>() { return H5T_NATIVE_UINT8; }
template <> hid_t native_type<uint32_t>() { return H5T_NATIVE_UINT32; }
template <> hid_t native_type<uint64_t>() { return H5T_NATIVE_UINT64; }

template <class T>
void write_vector(hid_t loc, const std::string& name, const std::vector<T>& data, const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> d = dims.empty() ? std::vector<hsize_t>{hsize_t(data.size())} : dims;
  Id space(H5_CHECK(H5Screate_simple(int(d.size()), d.data(), nullptr)));
  Id lcpl(H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  Id ds(H5_CHECK(H5Dcreate2(loc, name.c_str(), native_type<T>(), space, lcpl, H5P_DEFAULT, H5P_DEFAULT)));
  if (!data.empty()) H5_CHECK(H5Dwrite(ds, native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()));
}

template <class T>
Id open_dataset(hid_t loc, const std::string& name, const std::string& file, int64_t expect,
                std::vector<hsize_t>* dims_out, hsize_t* count) {
  if (!exists(loc, name)) throw Error(file + ": missing dataset '" + name + "'");
  Id ds(H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  Id type(H5_CHECK(H5Dget_type(ds)));
  Id mem(H5_CHECK(H5Tget_native_type(type, H5T_DIR_ASCEND)));
  if (H5Tequal(mem, native_type<T>()) <= 0)
    throw Error(file + ": dataset '" + name + "' has the wrong element type (expected " +
                std::to_string(sizeof(T)) + "-byte " +
                (std::is_floating_point_v<T> ? "float" : std::is_signed_v<T> ? "signed int" : "unsigned int") + ")");
  Id space(H5_CHECK(H5Dget_space(ds)));
  int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(rank);
  H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  hsize_t n = 1;
  for (auto x : dims)
    if (__builtin_mul_overflow(n, x, &n)) throw Error(file + ": dataset '" + name + "' has an impossible shape");
  // A hostile or corrupt header may claim any size: never allocate more than the file can hold
  // (uncompressed), or a generous compression ratio of it, before HDF5 finds the data missing.
  {
    Id dcpl(H5_CHECK(H5Dget_create_plist(ds)));
    hsize_t bytes = 0, fsize = 0;
    Id fid(H5_CHECK(H5Iget_file_id(ds)));
    H5_CHECK(H5Fget_filesize(fid, &fsize));
    const hsize_t cap = fsize * (H5Pget_nfilters(dcpl) > 0 ? 1100 : 1) + 1024;
    if (__builtin_mul_overflow(n, hsize_t(sizeof(T)), &bytes) || bytes > cap)
      throw Error(file + ": dataset '" + name + "' claims " + std::to_string(n) + " elements, more than the " +
                  std::to_string(fsize) + "-byte file can hold (truncated or corrupt?)");
  }
  if (expect >= 0 && n != hsize_t(expect))
    throw Error(file + ": dataset '" + name + "' has " + std::to_string(n) + " elements, expected " +
                std::to_string(expect));
  if (dims_out) *dims_out = dims;
  if (count) *count = n;
  return ds;
}

template <class T>
std::vector<T> read_vector(hid_t loc, const std::string& name, const std::string& file, int64_t expect,
                           std::vector<hsize_t>* dims_out) {
  hsize_t n = 0;
  Id ds = open_dataset<T>(loc, name, file, expect, dims_out, &n);
  std::vector<T> out(n);
  if (n) {
    if (H5Dread(ds, native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
      throw Error(file + ": cannot read dataset '" + name + "' (file truncated or corrupt?)");
  }
  return out;
}

#define SB_H5_INSTANTIATE(T)                                                                          \
  template void write_vector<T>(hid_t, const std::string&, const std::vector<T>&, const std::vector<hsize_t>&); \
  template std::vector<T> read_vector<T>(hid_t, const std::string&, const std::string&, int64_t, std::vector<hsize_t>*); \
  template Id open_dataset<T>(hid_t, const std::string&, const std::string&, int64_t, std::vector<hsize_t>*, hsize_t*);
SB_H5_INSTANTIATE(float)
SB_H5_INSTANTIATE(double)
SB_H5_INSTANTIATE(int32_t)
SB_H5_INSTANTIATE(int64_t)
SB_H5_INSTANTIATE(uint8_t)
SB_H5_INSTANTIATE(uint32_t)
SB_H5_INSTANTIATE(uint64_t)

}  // namespace sb::h5
