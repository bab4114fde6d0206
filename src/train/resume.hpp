// Resume (train --resume): which checkpoint, read and verified once on every rank, then applied by
// the Trainer (Trainer::read_resume / apply_checkpoint, defined in resume.cpp).
//
// A resume from a checkpoint older than the newest in checkpoint.dir starts a branch: the newer
// checkpoints (and, by the Trainer, a copy of the metrics log) move to
// checkpoint.dir/abandoned_after_step_<S>_<UTC time>/, so nothing of the abandoned run is deleted,
// a later --resume continues the branch, and retention (checkpoint.keep) sees only the live one.
// A fresh run (no --resume) into a checkpoint.dir that holds checkpoints is a branch at step 0:
// they move to checkpoint.dir/abandoned_after_step_00000000_<UTC time>/ with the metrics log.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "src/balance/latency_model.hpp"
#include "src/comm/comm.hpp"

namespace sb {

struct Restored {  // a checkpoint read and verified, not yet applied
  Checkpoint ck;
  std::string path;
  std::optional<LatencyModel> lm;
  std::vector<double> alphas;
  std::string lora_base, lora_base_xxh64;  // a LoRA checkpoint's base: where it came from, its hash
  // An error in the parts read after the checksum verified (latency model, recall): a real
  // mismatch (e.g. another model shape), so it must not make 'latest' fall back to an older one.
  std::exception_ptr error;
};

// `resume`: "" (fresh: nullopt), "latest" (the newest checkpoint in `dir` that reads and verifies;
// corrupt ones skipped with a warning; stale *.h5.tmp removed by the root; nullopt when there is
// none, an error when all are corrupt), or a path (read; errors propagate).
std::optional<Restored> find_resume(const std::string& resume, const std::string& dir, const Comm& comm,
                                    const std::function<Restored(const std::string&)>& read);

// Root only: moves every checkpoint in `dir` with a step after `step` into a new archive
// directory (printed) and returns its path, "" when there is none. Step 0 is a run without
// --resume moving an earlier run's checkpoints aside, and its message says so.
std::string archive_newer_checkpoints(const std::string& dir, int64_t step);

}  // namespace sb
