// HDF5 checkpoints: parameters under /params/<name> (Hugging Face names, PyTorch shapes), AdamW
// moments under /optim/m/<name> and /optim/v/<name>, the step, the data cursor (epoch, next
// document) and the skipped-step count, the full config text, the latency and recall models.
// No RNG state is stored, none is needed: every random choice is derived from the config's seeds
// (the shuffle from data.seed and the epoch, the initialisation from train.seed) and the cursor.
// Written atomically: a temporary file, flushed and fsynced, then renamed; a checksum over the
// contents is verified on load. Layout: io/README.md, "Checkpoint".
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <functional>
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

// Reads and verifies (format, version, shapes, checksum). `extra(file)` reads further groups.
Checkpoint read_checkpoint(const std::string& path, const std::function<void(hid_t file)>& extra = {});

// Checkpoints in a directory, newest step first (names ckpt_<step>.h5; temporaries ignored).
std::vector<std::string> list_checkpoints(const std::string& dir);
// Keep the newest `keep`, delete the rest.
void prune_checkpoints(const std::string& dir, int64_t keep);
std::string checkpoint_path(const std::string& dir, int64_t step);

}  // namespace sb
