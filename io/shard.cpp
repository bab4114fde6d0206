// Shard writer and reader. See shard.hpp for the format.
#include "io/shard.hpp"
#include "io/file_checksum.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace sb {

const char* task_name(int type) {
  switch (type) {
    case kTaskNone: return "none";
    case kTaskPasskey: return "passkey";
    case kTaskMultikey: return "multikey";
    case kTaskKvLookup: return "kv";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// An empty, extendible, chunked 1-D dataset of `type`.
h5::Id create_extendible(hid_t file, const char* name, hid_t type) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {ShardWriter::kChunk};
  h5::Id space(H5_CHECK(H5Screate_simple(1, dims, maxdims)));
  h5::Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(dcpl, 1, chunk));
  return h5::Id(H5_CHECK(H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
}

// Writes n elements at [at, at+n) of an extendible 1-D dataset, growing it.
void append(hid_t ds, hsize_t at, hsize_t n, hid_t mem_type, const void* data, const std::string& where) {
  hsize_t start[1] = {at}, count[1] = {n}, total[1] = {at + n};
  H5_CHECK(H5Dset_extent(ds, total));
  h5::Id fspace(H5_CHECK(H5Dget_space(ds)));
  H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr));
  h5::Id mspace(H5_CHECK(H5Screate_simple(1, count, nullptr)));
  if (H5Dwrite(ds, mem_type, mspace, fspace, H5P_DEFAULT, data) < 0)
    throw Error(where + " failed (disk full?)");
}

}  // namespace

ShardWriter::ShardWriter(const std::string& path, const ShardMeta& meta)
    : path_(path), tmp_(path + ".tmp"), meta_(meta) {
  if (meta.vocab_size <= 0 || meta.vocab_size > kMaxShardVocab)
    throw Error(path + ": vocab_size " + std::to_string(meta.vocab_size) + " must be in 1.." +
                std::to_string(kMaxShardVocab) + " (the range of model.vocab_size)");
  if (meta.eos_id < 0 || meta.eos_id >= meta.vocab_size)
    throw Error(path + ": eos_id " + std::to_string(meta.eos_id) + " must be < vocab_size");
  file_ = h5::create(tmp_);
  // An extendible, chunked /tokens lets us append documents without holding the shard in memory.
  tokens_ = create_extendible(file_, "tokens", H5T_STD_U32LE);
  buf_.reserve(16 * kChunk);
}

void ShardWriter::start_mask() {
  // Tokens written before the first masked document were all trained: back-fill ones.
  flush();
  mask_ = create_extendible(file_, "loss_mask", H5T_STD_U8LE);
  std::vector<uint8_t> ones(std::min<hsize_t>(buf_.capacity(), written_), 1);
  for (hsize_t at = 0; at < written_; at += ones.size())
    append(mask_, at, std::min<hsize_t>(ones.size(), written_ - at), H5T_NATIVE_UINT8, ones.data(),
           tmp_ + ": writing '/loss_mask'");
  mask_buf_.reserve(buf_.capacity());
}

ShardWriter::~ShardWriter() {
  if (closed_) return;
  mask_.reset(), tokens_.reset(), file_.reset();
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

void ShardWriter::add(std::span<const uint32_t> tokens, TaskSpan task, std::span<const uint8_t> mask) {
  if (closed_) throw Error(path_ + ": add() after close()");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (int64_t(tokens[i]) >= meta_.vocab_size)
      throw Error(path_ + ": document " + std::to_string(num_docs()) + " has token id " + std::to_string(tokens[i]) +
                  " at position " + std::to_string(i) + ", expected < vocab_size " + std::to_string(meta_.vocab_size));
  if (task.type >= kNumTaskTypes) throw Error(path_ + ": unknown task type " + std::to_string(task.type));
  if (task.type != kTaskNone && !(task.begin < task.end && task.end <= tokens.size()))
    throw Error(path_ + ": answer span [" + std::to_string(task.begin) + ", " + std::to_string(task.end) +
                ") of document " + std::to_string(num_docs()) + " is not inside its " +
                std::to_string(tokens.size()) + " tokens");
  if (!mask.empty()) {
    if (mask.size() != tokens.size())
      throw Error(path_ + ": document " + std::to_string(num_docs()) + " has " + std::to_string(mask.size()) +
                  " loss-mask values for " + std::to_string(tokens.size()) + " tokens, expected one per token");
    for (size_t i = 0; i < mask.size(); ++i)
      if (mask[i] > 1)
        throw Error(path_ + ": document " + std::to_string(num_docs()) + " has loss-mask value " +
                    std::to_string(mask[i]) + " at position " + std::to_string(i) + ", expected 0 or 1");
    if (!mask_.valid()) start_mask();
  }
  if (task.type == kTaskNone) task.begin = task.end = 0;
  types_.push_back(task.type);
  spans_.push_back(task.begin), spans_.push_back(task.end);
  offsets_.push_back(offsets_.back() + tokens.size());
  // Append in pieces so one huge document never doubles the buffer.
  for (size_t i = 0; i < tokens.size();) {
    size_t n = std::min(tokens.size() - i, buf_.capacity() - buf_.size());
    buf_.insert(buf_.end(), tokens.begin() + i, tokens.begin() + i + n);
    if (mask_.valid() && mask.empty()) mask_buf_.insert(mask_buf_.end(), n, uint8_t(1));
    if (mask_.valid() && !mask.empty()) mask_buf_.insert(mask_buf_.end(), mask.begin() + i, mask.begin() + i + n);
    i += n;
    if (buf_.size() == buf_.capacity()) flush();
  }
}

void ShardWriter::flush() {
  if (buf_.empty()) return;
  append(tokens_, written_, buf_.size(), H5T_NATIVE_UINT32, buf_.data(), tmp_ + ": writing '/tokens'");
  if (mask_.valid())
    append(mask_, written_, mask_buf_.size(), H5T_NATIVE_UINT8, mask_buf_.data(), tmp_ + ": writing '/loss_mask'");
  written_ += buf_.size();
  buf_.clear(), mask_buf_.clear();
}

void ShardWriter::close() {
  if (closed_) return;
  flush();
  h5::write_vector(file_, "doc_offsets", offsets_);
  // Task data only when some document has a task: plain text corpora stay minimal.
  bool any_task = false;
  for (auto t : types_) any_task |= t != kTaskNone;
  if (any_task) {
    h5::write_vector(file_, "task_type", types_);
    h5::write_vector(file_, "answer_spans", spans_, {hsize_t(types_.size()), 2});
  }
  h5::write_attr(file_, "format", std::string(kShardFormat));
  h5::write_attr(file_, "version", kShardVersion);
  h5::write_attr(file_, "vocab_size", meta_.vocab_size);
  h5::write_attr(file_, "tokenizer", meta_.tokenizer);
  h5::write_attr(file_, "eos_id", meta_.eos_id);
  mask_.reset(), tokens_.reset();
  H5_CHECK(H5Fflush(file_, H5F_SCOPE_GLOBAL));
  file_.reset();
  stamp_file_checksum(tmp_);  // complete and closed: the whole-file checksum, fsynced, then the rename
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) throw Error(path_ + ": cannot move the finished shard into place: " + ec.message());
  closed_ = true;
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

std::string type_desc(hid_t native) {
  for (auto [t, name] : {std::pair{H5T_NATIVE_UINT8, "uint8"}, {H5T_NATIVE_UINT16, "uint16"},
                         {H5T_NATIVE_UINT32, "uint32"}, {H5T_NATIVE_UINT64, "uint64"},
                         {H5T_NATIVE_INT8, "int8"}, {H5T_NATIVE_INT16, "int16"}, {H5T_NATIVE_INT32, "int32"},
                         {H5T_NATIVE_INT64, "int64"}, {H5T_NATIVE_FLOAT, "float32"},
                         {H5T_NATIVE_DOUBLE, "float64"}})
    if (H5Tequal(native, t) > 0) return name;
  return "a non-numeric type";
}

// Opens /name and checks its element type and rank; returns the dataset and its dims.
h5::Id open_checked(hid_t file, const std::string& name, const std::string& path, hid_t want,
                    const char* want_name, int want_rank, std::vector<hsize_t>& dims, bool no_cache = false) {
  if (!h5::exists(file, name)) throw Error(path + ": missing dataset '/" + name + "'");
  // Without a chunk cache HDF5 reads a selection of an uncompressed chunk straight from the
  // file, instead of pulling the whole chunk in for a few hundred tokens of a random document.
  h5::Id dapl(H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
  if (no_cache) H5_CHECK(H5Pset_chunk_cache(dapl, 0, 0, 1.0));
  h5::Id ds(H5Dopen2(file, name.c_str(), dapl));
  if (!ds.valid()) throw Error(path + ": cannot open dataset '/" + name + "' (file corrupt?)");
  h5::Id type(H5_CHECK(H5Dget_type(ds)));
  h5::Id native(H5_CHECK(H5Tget_native_type(type, H5T_DIR_ASCEND)));
  if (H5Tequal(native, want) <= 0)
    throw Error(path + ": dataset '/" + name + "' has element type " + type_desc(native) + ", expected " + want_name);
  h5::Id space(H5_CHECK(H5Dget_space(ds)));
  int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  if (rank != want_rank)
    throw Error(path + ": dataset '/" + name + "' has rank " + std::to_string(rank) + ", expected " +
                std::to_string(want_rank));
  dims.assign(rank, 0);
  H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return ds;
}

template <class T>
std::vector<T> read_all(hid_t ds, hid_t mem, size_t n, const std::string& path, const std::string& name) {
  // A corrupt header may claim any length: allocate no more than the file could hold.
  hsize_t fsize = 0;
  hid_t fid = H5Iget_file_id(ds);
  herr_t rc = fid < 0 ? -1 : H5Fget_filesize(fid, &fsize);
  if (fid >= 0) H5Fclose(fid);
  if (rc < 0 || n > (fsize * 1100 + 1024) / sizeof(T))
    throw Error(path + ": dataset '/" + name + "' claims " + std::to_string(n) + " entries, more than the " +
                std::to_string(fsize) + "-byte file can hold (truncated or corrupt?)");
  std::vector<T> out(n);
  if (n && H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw Error(path + ": cannot read dataset '/" + name + "' (file truncated or corrupt?)");
  return out;
}

ShardMeta read_meta(hid_t file, const std::string& path) {
  h5::check_format(file, path, kShardFormat, kShardVersion, "a shard");
  ShardMeta m;
  m.vocab_size = h5::read_attr_int(file, "vocab_size", path);
  if (m.vocab_size <= 0 || m.vocab_size > kMaxShardVocab)
    throw Error(path + ": attribute 'vocab_size' is " + std::to_string(m.vocab_size) + ", expected 1.." +
                std::to_string(kMaxShardVocab) + " (the range of model.vocab_size)");
  m.tokenizer = h5::read_attr_string(file, "tokenizer", path);
  m.eos_id = h5::read_attr_int(file, "eos_id", path);
  if (m.eos_id < 0 || m.eos_id >= m.vocab_size)
    throw Error(path + ": attribute 'eos_id' is " + std::to_string(m.eos_id) + ", expected 0 <= eos_id < vocab_size " +
                std::to_string(m.vocab_size));
  return m;
}

}  // namespace

ShardReader ShardReader::open(const std::string& path) {
  ShardReader r;
  r.path_ = path;
  r.file_ = std::make_shared<h5::Id>(h5::open_read(path, "a token shard (sparsebalance prep)"));
  hid_t f = *r.file_;
  r.meta_ = read_meta(f, path);

  std::vector<hsize_t> dims;
  r.tokens_ = std::make_shared<h5::Id>(open_checked(f, "tokens", path, H5T_NATIVE_UINT32, "uint32", 1, dims, true));
  const uint64_t n_tokens = dims[0];
  {  // documents are read whole: a corrupt header must not claim more tokens than the file holds
    hsize_t fsize = 0;
    H5_CHECK(H5Fget_filesize(f, &fsize));
    if (n_tokens > (fsize * 1100 + 1024) / sizeof(uint32_t))
      throw Error(path + ": dataset '/tokens' claims " + std::to_string(n_tokens) + " tokens, more than the " +
                  std::to_string(fsize) + "-byte file can hold (truncated or corrupt?)");
  }
  h5::Id off_ds = open_checked(f, "doc_offsets", path, H5T_NATIVE_UINT64, "uint64", 1, dims);
  if (dims[0] < 1) throw Error(path + ": dataset '/doc_offsets' is empty, expected D+1 >= 1 entries");
  r.offsets_ = read_all<uint64_t>(off_ds, H5T_NATIVE_UINT64, dims[0], path, "doc_offsets");
  const auto& off = r.offsets_;
  if (off[0] != 0)
    throw Error(path + ": dataset '/doc_offsets' starts at " + std::to_string(off[0]) + ", expected 0");
  for (size_t d = 1; d < off.size(); ++d) {
    if (off[d] < off[d - 1])
      throw Error(path + ": dataset '/doc_offsets' decreases at entry " + std::to_string(d) + " (" +
                  std::to_string(off[d - 1]) + " -> " + std::to_string(off[d]) + "), expected non-decreasing");
    if (off[d] > n_tokens)
      throw Error(path + ": dataset '/doc_offsets' entry " + std::to_string(d) + " = " + std::to_string(off[d]) +
                  " is beyond the " + std::to_string(n_tokens) + " tokens of '/tokens'");
  }
  if (off.back() != n_tokens)
    throw Error(path + ": dataset '/doc_offsets' ends at " + std::to_string(off.back()) +
                ", expected the token count of '/tokens' (" + std::to_string(n_tokens) + ")");
  const uint64_t D = off.size() - 1;

  // Optional task data: both datasets or neither, one entry per document, spans inside the doc.
  bool has_type = h5::exists(f, "task_type"), has_span = h5::exists(f, "answer_spans");
  if (has_type != has_span)
    throw Error(path + ": dataset '/" + std::string(has_type ? "answer_spans" : "task_type") +
                "' is missing, expected '/task_type' and '/answer_spans' together");
  if (has_type) {
    h5::Id t_ds = open_checked(f, "task_type", path, H5T_NATIVE_UINT8, "uint8", 1, dims);
    if (dims[0] != D)
      throw Error(path + ": dataset '/task_type' has " + std::to_string(dims[0]) + " entries, expected one per document (" +
                  std::to_string(D) + ")");
    r.types_ = read_all<uint8_t>(t_ds, H5T_NATIVE_UINT8, D, path, "task_type");
    h5::Id s_ds = open_checked(f, "answer_spans", path, H5T_NATIVE_UINT64, "uint64", 2, dims);
    if (dims[0] != D || dims[1] != 2)
      throw Error(path + ": dataset '/answer_spans' has shape [" + std::to_string(dims[0]) + "," +
                  std::to_string(dims[1]) + "], expected [" + std::to_string(D) + ",2]");
    r.spans_ = read_all<uint64_t>(s_ds, H5T_NATIVE_UINT64, 2 * D, path, "answer_spans");
    for (uint64_t d = 0; d < D; ++d) {
      if (r.types_[d] >= kNumTaskTypes)
        throw Error(path + ": dataset '/task_type' entry " + std::to_string(d) + " = " + std::to_string(r.types_[d]) +
                    ", expected 0..3");
      uint64_t b = r.spans_[2 * d], e = r.spans_[2 * d + 1], len = off[d + 1] - off[d];
      if (r.types_[d] != kTaskNone && !(b < e && e <= len))
        throw Error(path + ": dataset '/answer_spans' entry " + std::to_string(d) + " = [" + std::to_string(b) + ", " +
                    std::to_string(e) + ") is not inside its document of " + std::to_string(len) +
                    " tokens (expected begin < end <= length)");
    }
  }
  // Optional loss mask: one uint8 per token (its values are checked where they are read).
  if (h5::exists(f, "loss_mask")) {
    r.mask_ = std::make_shared<h5::Id>(open_checked(f, "loss_mask", path, H5T_NATIVE_UINT8, "uint8", 1, dims, true));
    if (dims[0] != n_tokens)
      throw Error(path + ": dataset '/loss_mask' has " + std::to_string(dims[0]) + " entries, expected one per token (" +
                  std::to_string(n_tokens) + ")");
  }
  return r;
}

TaskSpan ShardReader::task(uint64_t doc) const {
  if (doc >= num_docs()) throw Error(path_ + ": document " + std::to_string(doc) + " out of range");
  if (types_.empty()) return {};
  return {types_[doc], spans_[2 * doc], spans_[2 * doc + 1]};
}

// Reads [begin, begin+count) of a 1-D dataset into out (a hyperslab selection).
static void read_slab(hid_t ds, uint64_t begin, uint64_t count, hid_t mem_type, void* out, const std::string& path,
                      const char* name) {
  if (count == 0) return;
  hsize_t start[1] = {begin}, cnt[1] = {count};
  h5::Id fspace(H5_CHECK(H5Dget_space(ds)));
  H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, cnt, nullptr));
  h5::Id mspace(H5_CHECK(H5Screate_simple(1, cnt, nullptr)));
  if (H5Dread(ds, mem_type, mspace, fspace, H5P_DEFAULT, out) < 0)
    throw Error(path + ": cannot read '/" + name + "' [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                ") (file truncated or corrupt?)");
}

void ShardReader::read_tokens(uint64_t begin, uint64_t count, uint32_t* out) const {
  if (begin + count > num_tokens())
    throw Error(path_ + ": token range [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                ") beyond '/tokens' (" + std::to_string(num_tokens()) + ")");
  read_slab(*tokens_, begin, count, H5T_NATIVE_UINT32, out, path_, "tokens");
}

void ShardReader::read_mask(uint64_t begin, uint64_t count, uint8_t* out) const {
  if (begin + count > num_tokens())
    throw Error(path_ + ": loss-mask range [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                ") beyond '/tokens' (" + std::to_string(num_tokens()) + ")");
  if (!mask_) return void(std::fill(out, out + count, uint8_t(1)));
  read_slab(*mask_, begin, count, H5T_NATIVE_UINT8, out, path_, "loss_mask");
  for (uint64_t i = 0; i < count; ++i)
    if (out[i] > 1)
      throw Error(path_ + ": dataset '/loss_mask' has value " + std::to_string(out[i]) + " at token " +
                  std::to_string(begin + i) + ", expected 0 or 1");
}

void ShardReader::check_ids(const uint32_t* ids, uint64_t n, uint64_t at) const {
  // A max reduction vectorizes; the slow search for the culprit runs only when one exists.
  uint32_t mx = 0;
  for (uint64_t i = 0; i < n; ++i) mx = std::max(mx, ids[i]);
  if (int64_t(mx) < meta_.vocab_size) return;
  for (uint64_t i = 0; i < n; ++i) {
    if (int64_t(ids[i]) < meta_.vocab_size) continue;
    uint64_t pos = at + i;
    uint64_t doc = std::upper_bound(offsets_.begin(), offsets_.end(), pos) - offsets_.begin() - 1;
    throw Error(path_ + ": dataset '/tokens' has id " + std::to_string(ids[i]) + " at token " + std::to_string(pos) +
                " (document " + std::to_string(doc) + "), expected < vocab_size " + std::to_string(meta_.vocab_size));
  }
}

std::vector<uint32_t> ShardReader::read_doc(uint64_t doc) const {
  if (doc >= num_docs())
    throw Error(path_ + ": document " + std::to_string(doc) + " out of range (" + std::to_string(num_docs()) + " documents)");
  uint64_t b = offsets_[doc], n = offsets_[doc + 1] - b;
  std::vector<uint32_t> out(n);
  read_tokens(b, n, out.data());
  check_ids(out.data(), n, b);
  return out;
}

std::vector<uint32_t> ShardReader::read_window(uint64_t doc, uint64_t begin, uint64_t count) const {
  if (doc >= num_docs())
    throw Error(path_ + ": document " + std::to_string(doc) + " out of range (" + std::to_string(num_docs()) + " documents)");
  const uint64_t len = offsets_[doc + 1] - offsets_[doc];
  if (begin > len || count > len - begin)
    throw Error(path_ + ": window [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                ") lies outside document " + std::to_string(doc) + " of length " + std::to_string(len));
  std::vector<uint32_t> out(count);
  read_tokens(offsets_[doc] + begin, count, out.data());
  check_ids(out.data(), count, offsets_[doc] + begin);
  return out;
}

void ShardReader::verify() const {
  constexpr uint64_t kBlock = 1 << 20;  // 4 MiB at a time: bounded memory for any shard size
  std::vector<uint32_t> buf(std::min<uint64_t>(kBlock, num_tokens()));
  for (uint64_t at = 0; at < num_tokens(); at += kBlock) {
    uint64_t n = std::min(kBlock, num_tokens() - at);
    read_tokens(at, n, buf.data());
    check_ids(buf.data(), n, at);
  }
  if (!mask_) return;
  std::vector<uint8_t> mask(std::min<uint64_t>(kBlock, num_tokens()));
  for (uint64_t at = 0; at < num_tokens(); at += kBlock) read_mask(at, std::min(kBlock, num_tokens() - at), mask.data());
}

}  // namespace sb
