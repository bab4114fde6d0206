// Token shards (DESIGN.md, "Files and formats"): one HDF5 file per shard,
//   /tokens        uint32 [N]     every document's tokens, back to back (chunked, streamed)
//   /doc_offsets   uint64 [D+1]   document d is tokens[offsets[d], offsets[d+1])
//   /task_type     uint8  [D]     optional: 0 none, 1 passkey, 2 multikey needle, 3 kv lookup
//   /answer_spans  uint64 [D,2]   optional: (begin, end) of the answer, token offsets within the doc
//   /loss_mask     uint8  [N]     optional: 1 = the token is a training target, 0 = context only;
//                                 absent = every token is trained (io/README.md, "Loss mask")
// root attributes: format="sparsebalance-shard", version=1, vocab_size, tokenizer, eos_id.
// A Dataset is a directory of shards (sorted by name) or one shard file; it keeps only the
// document lengths in memory and reads documents with hyperslab selections.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/h5.hpp"

namespace sb {

inline constexpr const char* kShardFormat = "sparsebalance-shard";
inline constexpr int64_t kShardVersion = 1;
// The largest vocabulary a shard may declare: the largest model.vocab_size (its schema range; a
// test checks that they agree). A larger one could not be trained on, and used to crash train.
inline constexpr int64_t kMaxShardVocab = int64_t(1) << 24;

enum TaskType : uint8_t { kTaskNone = 0, kTaskPasskey = 1, kTaskMultikey = 2, kTaskKvLookup = 3 };
inline constexpr int kNumTaskTypes = 4;
const char* task_name(int type);  // "none", "passkey", "multikey", "kv"

struct TaskSpan { uint8_t type = 0; uint64_t begin = 0, end = 0; };   // answer span within the doc

struct ShardMeta {
  int64_t vocab_size = 0;
  std::string tokenizer;
  int64_t eos_id = 0;
};

// Streams documents into one shard. Writes to PATH.tmp and renames to PATH in close(), so a
// crashed prep never leaves a shard that looks complete. Destroying an unclosed writer removes
// the temporary file.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, const ShardMeta& meta);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document; ids are checked < vocab_size, the span against the document. `mask`
  // (one 0/1 per token) marks its training targets; empty = all trained. The shard gets
  // /loss_mask from its first masked document on (earlier documents: all 1).
  void add(std::span<const uint32_t> tokens, TaskSpan task = {}, std::span<const uint8_t> mask = {});
  void close();
  uint64_t num_docs() const { return offsets_.size() - 1; }
  uint64_t num_tokens() const { return offsets_.back(); }

  static constexpr hsize_t kChunk = 1 << 16;  // tokens per HDF5 chunk (256 KiB)

 private:
  void flush();
  void start_mask();
  std::string path_, tmp_;
  ShardMeta meta_;
  h5::Id file_, tokens_, mask_;   // mask_ valid once a masked document came
  std::vector<uint32_t> buf_;     // tokens not yet written
  std::vector<uint8_t> mask_buf_; // their mask values (while mask_ is valid)
  hsize_t written_ = 0;           // tokens in the file
  std::vector<uint64_t> offsets_{0};
  std::vector<uint8_t> types_;
  std::vector<uint64_t> spans_;   // begin,end per doc
  bool closed_ = false;
};

// One shard opened read-only. open() validates the header, offsets and task data (not the
// token ids: read_doc checks those of each document it reads, verify() checks all).
class ShardReader {
 public:
  static ShardReader open(const std::string& path);
  const std::string& path() const { return path_; }
  const ShardMeta& meta() const { return meta_; }
  uint64_t num_docs() const { return offsets_.size() - 1; }
  uint64_t num_tokens() const { return offsets_.back(); }
  const std::vector<uint64_t>& offsets() const { return offsets_; }
  bool has_tasks() const { return !types_.empty(); }
  TaskSpan task(uint64_t doc) const;
  std::vector<uint32_t> read_doc(uint64_t doc) const;
  // Tokens [begin, begin+count) of document `doc` (a training window), ids checked < vocab_size:
  // an error names the shard, the token and the document.
  std::vector<uint32_t> read_window(uint64_t doc, uint64_t begin, uint64_t count) const;
  // Reads tokens [begin, begin+count) into out (no id check); a hyperslab of /tokens.
  void read_tokens(uint64_t begin, uint64_t count, uint32_t* out) const;
  bool has_mask() const { return mask_ != nullptr; }
  // The loss mask of tokens [begin, begin+count) (all 1 without /loss_mask); values checked 0/1.
  void read_mask(uint64_t begin, uint64_t count, uint8_t* out) const;
  // Streams through every token and checks ids < vocab_size (and mask values 0/1); throws on
  // the first bad one.
  void verify() const;

 private:
  void check_ids(const uint32_t* ids, uint64_t n, uint64_t at) const;
  std::string path_;
  ShardMeta meta_;
  std::shared_ptr<h5::Id> file_, tokens_, mask_;  // shared so readers (and Datasets) copy cheaply
  std::vector<uint64_t> offsets_;
  std::vector<uint8_t> types_;
  std::vector<uint64_t> spans_;
};

class Dataset {            // a directory of *.h5 shards (sorted by name) or one shard file
 public:
  static Dataset open(const std::string& path);        // validates every shard's header+offsets
  // A mixture (data.sources): the sources' documents one after another (source i's documents are
  // [source_begin(i), source_begin(i+1))), one vocabulary and tokenizer across them. Errors name
  // data.sources[i].path: a source that cannot be opened, holds no documents or another tokenizer.
  static Dataset open_sources(const std::vector<std::string>& paths);
  size_t num_sources() const { return source_paths_.size(); }  // 1 for open()
  const std::string& source_path(size_t i) const { return source_paths_[i]; }
  uint64_t source_begin(size_t i) const { return source_first_doc_[i]; }  // i = num_sources(): the end
  size_t source_of(uint64_t doc) const;
  uint64_t num_docs() const { return lengths_.size(); }
  uint64_t num_tokens() const { return num_tokens_; }
  uint64_t doc_length(uint64_t doc) const;             // global doc index
  const std::vector<uint64_t>& doc_lengths() const { return lengths_; }
  std::vector<uint32_t> read_doc(uint64_t doc) const;  // hyperslab read, ids checked < vocab
  TaskSpan task(uint64_t doc) const;
  bool has_masks() const { return has_masks_; }  // some shard has /loss_mask
  // The loss mask of tokens [begin, begin+count) of a global document (all 1 where none).
  std::vector<uint8_t> read_mask(uint64_t doc, uint64_t begin, uint64_t count) const;
  int64_t vocab_size() const { return meta_.vocab_size; }
  int64_t eos_id() const { return meta_.eos_id; }
  const std::string& tokenizer() const { return meta_.tokenizer; }
  const std::string& path() const { return path_; }
  const std::vector<ShardReader>& shards() const { return shards_; }
  // Which shard holds a global document, and its index there.
  std::pair<size_t, uint64_t> locate(uint64_t doc) const;
  // Deterministic shuffle by seed of all docs, then the last round(val_fraction*D) (at least 1
  // if val_fraction>0 and D>1, at most D-1) go to validation. A mixture splits each source so
  // (D its documents): train_docs lists them source after source, val_docs takes the sources in
  // turn (one of each, then the next of each, ...) so that any prefix of it covers them all.
  std::vector<uint64_t> train_docs(uint64_t seed, double val_fraction) const;
  std::vector<uint64_t> val_docs(uint64_t seed, double val_fraction) const;
  std::vector<uint64_t> source_train_docs(size_t source, uint64_t seed, double val_fraction) const;
  std::vector<uint64_t> source_val_docs(size_t source, uint64_t seed, double val_fraction) const;
  void verify() const;  // every token id of every shard < vocab_size

 private:
  std::string path_;
  ShardMeta meta_;
  std::vector<ShardReader> shards_;
  std::vector<uint64_t> first_doc_;  // global index of each shard's first document (+ total)
  std::vector<uint64_t> lengths_;
  uint64_t num_tokens_ = 0;
  bool has_masks_ = false;
  std::vector<std::string> source_paths_;
  std::vector<uint64_t> source_first_doc_;  // global index of each source's first document (+ total)
};

// The shard files of a dataset path: the file itself, or the sorted *.h5 of a directory.
std::vector<std::string> shard_files(const std::string& path);

// Deterministic shuffle of 0..n-1 (std::mt19937_64 with our own bounded draw, so the order is
// the same with every standard library).
std::vector<uint64_t> shuffled_indices(uint64_t n, uint64_t seed);

}  // namespace sb
