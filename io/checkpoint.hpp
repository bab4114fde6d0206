// HDF5 checkpoints: parameters under /params/<name> (Hugging Face names, PyTorch shapes), AdamW
// moments under /optim/m/<name> and /optim/v/<name>, the step, the data cursor (epoch, next
// document) and the skipped-step count, the full config text, the latency and recall models.
// No RNG state is stored, none is needed: every random choice is derived from the config's seeds
// (the shuffle from data.seed and the epoch, the initialisation from train.seed) and the cursor.
// Written atomically: a temporary file, flushed and fsynced, then renamed; a checksum over the
// contents is verified on load. Layout: io/README.md, "Checkpoint".
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace sb {

struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset, size;  // into the flat buffers
};

struct Checkpoint {
  int64_t step = 0;           // optimizer steps completed
  int64_t ranks = 1;          // MPI ranks of the run that wrote it
  std::string config_toml;    // the effective config
  int64_t data_epoch = 0, data_cursor = 0;  // next document: position in the epoch's order
  // data.sources (src/train/batch.hpp, MixCursor): each source's epoch and position, and the
  // documents drawn so far; empty for data.path. /state/source_epoch, /state/source_index (int64
  // [sources]) and the attribute /state/data_draws.
  std::vector<int64_t> source_epochs, source_indexes;
  int64_t data_draws = 0;
  int64_t skipped_steps = 0;  // consecutive non-finite steps skipped before this point
  std::vector<CheckpointTensor> tensors;
  std::vector<float> params, m, v;  // flat, in tensors order
};

inline constexpr const char* kCheckpointFormat = "sparsebalance-checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;

// Atomic write. `extra(file)` may add groups (e.g. /latency) before the file is sealed.
// Throws sb::Error naming the path; a failed write never touches an existing file of that name.
void write_checkpoint(const std::string& path, const Checkpoint& ck,
                      const std::function<void(hid_t file)>& extra = {});

// One rank's part of a checkpoint written by every rank (train.zero = 1): all parameters (read on
// rank 0 only) and this rank's contiguous slice [lo, lo + m.size()) of the flat moments.
struct CheckpointSlice {
  std::span<const float> params;
  size_t lo = 0;
  std::span<const float> m, v;
};

// How the ranks' slices reach the file. Collective: every rank writes its slice into the one
// file through parallel HDF5 (MPI-IO); Stream: rank 0 receives the slices one bounded piece at a
// time and writes them (serial HDF5). kCollectiveCheckpoints: this build's HDF5 can do Collective.
enum class CheckpointIo { Collective, Stream };
#ifdef SB_HDF5_PARALLEL
inline constexpr bool kCollectiveCheckpoints = true;
#else
inline constexpr bool kCollectiveCheckpoints = false;
#endif

// Collective over `comm` (every rank calls it; the slices, in rank order, tile the parameters).
// `meta`: step, cursor, config and tensors (its buffers empty; the same on every rank). The file
// is the one write_checkpoint writes for the gathered state, bit for bit in its datasets, checksum
// included; read_checkpoint reads it. Atomic as write_checkpoint: the temporary is renamed by rank
// 0 once every rank's part is written and synced. `extra(file)` runs on rank 0 only. Throws the
// same sb::Error on every rank when the write fails on any.
void write_checkpoint_slices(const std::string& path, const Checkpoint& meta, const CheckpointSlice& mine,
                              MPI_Comm comm, CheckpointIo how, const std::function<void(hid_t file)>& extra = {});

// Reads and verifies (format, version, shapes, checksum). `extra(file)` reads further groups.
Checkpoint read_checkpoint(const std::string& path, const std::function<void(hid_t file)>& extra = {});

// What one rank reads of a checkpoint (train.zero = 1 resumes: its slice [lo, hi) of the flat
// moments; the parameters whole). A destination span of exactly the right size (params: the
// checkpoint's num_params; m, v: hi - lo) is filled in place, so the values are never twice in
// memory; otherwise (empty, or another size) they land in the returned Checkpoint's vectors.
struct CheckpointSliceRead {
  size_t lo = 0, hi = 0;  // clamped to the checkpoint's parameter count
  std::span<float> params, m, v;
  size_t piece_floats = size_t(1) << 28;  // most values one read call transfers (1 GiB; tests: tiny)
  size_t* largest_read = nullptr;         // out, optional: the most values any one call read here
};

// Collective over `comm` (every rank calls it, each with its own slice). Reads through parallel
// HDF5 (MPI-IO, collective reads) where the build has it, else with independent serial reads;
// verifies as read_checkpoint does, with the checksum chained through the ranks (each hashes its
// part), and throws the same sb::Error on every rank when the file fails anywhere. The returned
// Checkpoint's m and v (when not read in place) hold [lo, hi) only. `extra(file)` runs on every
// rank. Layout of the reads: io/README.md, "Reading a slice".
Checkpoint read_checkpoint_slice(const std::string& path, const CheckpointSliceRead& how, MPI_Comm comm,
                                 const std::function<void(hid_t file)>& extra = {});

// Checkpoints in a directory, newest step first (names ckpt_<step>.h5; temporaries ignored).
std::vector<std::string> list_checkpoints(const std::string& dir);
// Keep the newest `keep`, delete the rest.
void prune_checkpoints(const std::string& dir, int64_t keep);
std::string checkpoint_path(const std::string& dir, int64_t step);

}  // namespace sb
