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
  ds.source_paths_ = {path};
  ds.source_first_doc_ = {0, ds.lengths_.size()};
  return ds;
}

Dataset Dataset::open_sources(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("data.sources is empty: expected at least one { path, weight }");
  Dataset ds;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string key = "data.sources[" + std::to_string(i) + "].path";
    Dataset one;
    try {
      one = open(paths[i]);
    } catch (const std::exception& e) {
      std::string why = e.what();  // it names the path already: say it once
      if (why.rfind(paths[i] + ": ", 0) == 0) why.erase(0, paths[i].size() + 2);
      throw Error(key + " = " + paths[i] + ": " + why);
    }
    if (one.num_docs() == 0) throw Error(key + " = " + paths[i] + ": holds no documents; expected a prepped dataset");
    if (i == 0) {
      ds.meta_ = one.meta_;
      ds.path_ = paths[i];
    } else {
      const auto& m = one.meta_;
      if (m.vocab_size != ds.meta_.vocab_size || m.tokenizer != ds.meta_.tokenizer || m.eos_id != ds.meta_.eos_id)
        throw Error(key + " = " + paths[i] + ": vocab_size/tokenizer/eos_id (" + std::to_string(m.vocab_size) + ", " +
                    m.tokenizer + ", " + std::to_string(m.eos_id) + ") differ from data.sources[0]'s (" +
                    std::to_string(ds.meta_.vocab_size) + ", " + ds.meta_.tokenizer + ", " +
                    std::to_string(ds.meta_.eos_id) + "); expected one tokenizer across the sources");
      ds.path_ += " + " + paths[i];
    }
    ds.source_paths_.push_back(paths[i]);
    ds.source_first_doc_.push_back(ds.lengths_.size());
    for (auto& sh : one.shards_) {
      ds.first_doc_.push_back(ds.lengths_.size());
      const auto& off = sh.offsets();
      for (size_t d = 0; d + 1 < off.size(); ++d) ds.lengths_.push_back(off[d + 1] - off[d]);
      ds.shards_.push_back(std::move(sh));
    }
    ds.num_tokens_ += one.num_tokens_;
    ds.has_masks_ |= one.has_masks_;
  }
  ds.first_doc_.push_back(ds.lengths_.size());
  ds.source_first_doc_.push_back(ds.lengths_.size());
  return ds;
}

size_t Dataset::source_of(uint64_t doc) const {
  locate(doc);  // range check
  return size_t(std::upper_bound(source_first_doc_.begin(), source_first_doc_.end(), doc) - source_first_doc_.begin() - 1);
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

// One source's split (the whole dataset for open()): its documents shuffled by seed, offset to
// global ids; the last val_count of them are validation.
std::vector<uint64_t> Dataset::source_train_docs(size_t src, uint64_t seed, double val_fraction) const {
  const uint64_t first = source_first_doc_.at(src), n = source_first_doc_.at(src + 1) - first;
  auto idx = shuffled_indices(n, seed);
  idx.resize(n - val_count(n, val_fraction));
  for (auto& d : idx) d += first;
  return idx;
}

std::vector<uint64_t> Dataset::source_val_docs(size_t src, uint64_t seed, double val_fraction) const {
  const uint64_t first = source_first_doc_.at(src), n = source_first_doc_.at(src + 1) - first;
  auto idx = shuffled_indices(n, seed);
  std::vector<uint64_t> val(idx.end() - val_count(n, val_fraction), idx.end());
  for (auto& d : val) d += first;
  return val;
}

std::vector<uint64_t> Dataset::train_docs(uint64_t seed, double val_fraction) const {
  std::vector<uint64_t> out;
  for (size_t s = 0; s < num_sources(); ++s) {
    auto part = source_train_docs(s, seed, val_fraction);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<uint64_t> Dataset::val_docs(uint64_t seed, double val_fraction) const {
  std::vector<std::vector<uint64_t>> per(num_sources());
  size_t most = 0;
  for (size_t s = 0; s < per.size(); ++s) most = std::max(most, (per[s] = source_val_docs(s, seed, val_fraction)).size());
  std::vector<uint64_t> out;  // the sources in turn
  for (size_t k = 0; k < most; ++k)
    for (const auto& p : per)
      if (k < p.size()) out.push_back(p[k]);
  return out;
}

}  // namespace sb
