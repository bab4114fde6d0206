// Dataset: many shards seen as one list of documents, plus the deterministic train/val split.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "io/shard.hpp"

namespace sb {

std::vector<std::string> shard_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path + ": no such file or directory");
  if (!fs::is_directory(path, ec)) {
    if (!fs::is_regular_file(path, ec))  // a FIFO would block the open forever
      throw Error(path + ": not a regular file or directory (a FIFO or device?); data.path expects shards");
    return {path};
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file() && e.path().extension() == ".h5") files.push_back(e.path().string());
  if (ec) throw Error(path + ": cannot list directory: " + ec.message());
  if (files.empty()) throw Error(path + ": directory holds no *.h5 shards (run `sparsebalance prep` first?)");
  std::sort(files.begin(), files.end());
  return files;
}

Dataset Dataset::open(const std::string& path) {
  Dataset ds;
  ds.path_ = path;
  for (const auto& file : shard_files(path)) {
    auto shard = ShardReader::open(file);
    const auto& m = shard.meta();
    if (ds.shards_.empty()) {
      ds.meta_ = m;
    } else if (m.vocab_size != ds.meta_.vocab_size || m.tokenizer != ds.meta_.tokenizer || m.eos_id != ds.meta_.eos_id) {
      throw Error(file + ": attributes vocab_size/tokenizer/eos_id (" + std::to_string(m.vocab_size) + ", " + m.tokenizer +
                  ", " + std::to_string(m.eos_id) + ") differ from " + ds.shards_[0].path() + " (" +
                  std::to_string(ds.meta_.vocab_size) + ", " + ds.meta_.tokenizer + ", " +
                  std::to_string(ds.meta_.eos_id) + "); expected one tokenizer per dataset");
    }
    ds.first_doc_.push_back(ds.lengths_.size());
    const auto& off = shard.offsets();
    for (size_t d = 0; d + 1 < off.size(); ++d) ds.lengths_.push_back(off[d + 1] - off[d]);
    ds.num_tokens_ += shard.num_tokens();
    ds.has_masks_ |= shard.has_mask();
    ds.shards_.push_back(std::move(shard));
  }
  ds.first_doc_.push_back(ds.lengths_.size());
  return ds;
}

std::pair<size_t, uint64_t> Dataset::locate(uint64_t doc) const {
  if (doc >= num_docs())
    throw Error(path_ + ": document " + std::to_string(doc) + " out of range (" + std::to_string(num_docs()) +
                " documents)");
  size_t s = std::upper_bound(first_doc_.begin(), first_doc_.end(), doc) - first_doc_.begin() - 1;
  return {s, doc - first_doc_[s]};
}

uint64_t Dataset::doc_length(uint64_t doc) const {
  locate(doc);  // range check with a clear message
  return lengths_[doc];
}

std::vector<uint32_t> Dataset::read_doc(uint64_t doc) const {
  auto [s, d] = locate(doc);
  return shards_[s].read_doc(d);
}

TaskSpan Dataset::task(uint64_t doc) const {
  auto [s, d] = locate(doc);
  return shards_[s].task(d);
}

std::vector<uint8_t> Dataset::read_mask(uint64_t doc, uint64_t begin, uint64_t count) const {
  auto [s, d] = locate(doc);
  const ShardReader& r = shards_[s];
  uint64_t len = r.offsets()[d + 1] - r.offsets()[d];
  if (begin + count > len)
    throw Error(r.path() + ": loss-mask window [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                ") lies outside document " + std::to_string(doc) + " of length " + std::to_string(len));
  std::vector<uint8_t> out(count);
  r.read_mask(r.offsets()[d] + begin, count, out.data());
  return out;
}

void Dataset::verify() const {
  for (const auto& s : shards_) s.verify();
}

std::vector<uint64_t> shuffled_indices(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> idx(n);
  for (uint64_t i = 0; i < n; ++i) idx[i] = i;
  std::mt19937_64 rng(seed);  // the engine is fully specified by the standard; distributions are not
  for (uint64_t i = n; i > 1; --i) {
    // Unbiased draw in [0, i) by rejection.
    uint64_t limit = UINT64_MAX - UINT64_MAX % i, x;
    do x = rng(); while (x >= limit);
    std::swap(idx[i - 1], idx[x % i]);
  }
  return idx;
}

static uint64_t val_count(uint64_t n, double val_fraction) {
  if (!(val_fraction >= 0 && val_fraction < 1))
    throw Error("data.val_fraction = " + std::to_string(val_fraction) + ": expected 0 <= fraction < 1");
  uint64_t v = uint64_t(std::llround(val_fraction * double(n)));
  if (val_fraction > 0 && n > 1) v = std::clamp<uint64_t>(v, 1, n - 1);  // both sides non-empty
  return std::min(v, n);
}

std::vector<uint64_t> Dataset::train_docs(uint64_t seed, double val_fraction) const {
  auto idx = shuffled_indices(num_docs(), seed);
  idx.resize(num_docs() - val_count(num_docs(), val_fraction));
  return idx;
}

std::vector<uint64_t> Dataset::val_docs(uint64_t seed, double val_fraction) const {
  auto idx = shuffled_indices(num_docs(), seed);
  return {idx.end() - val_count(num_docs(), val_fraction), idx.end()};
}

}  // namespace sb
