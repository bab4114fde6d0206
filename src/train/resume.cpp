#include "src/train/resume.hpp"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "io/h5.hpp"
#include "base/error.hpp"
#include "src/train/weights.hpp"
#include "src/train/trainer.hpp"

namespace sb {

namespace fs = std::filesystem;

std::optional<Restored> find_resume(const std::string& resume, const std::string& dir, const Comm& comm,
                                    const std::function<Restored(const std::string&)>& read) {
  if (resume.empty()) return std::nullopt;
  if (resume != "latest") return read(resume);
  // Temporaries (*.h5.tmp, left by a job killed while writing) are never listed; the root removes them.
  if (comm.root()) {
    std::error_code ec;
    if (fs::is_directory(dir, ec))
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.starts_with("ckpt_") && name.ends_with(".h5.tmp")) {
          std::error_code rm;
          fs::remove(e.path(), rm);
          std::fprintf(stderr, "resume: removed stale temporary %s (an interrupted checkpoint write)\n",
                       e.path().string().c_str());
        }
      }
  }
  auto all = list_checkpoints(dir);
  std::string bad;
  for (const auto& p : all) {
    try {
      return read(p);
    } catch (const std::exception& e) {
      bad += (bad.empty() ? "" : "; ") + std::string(e.what());
      if (comm.root()) std::fprintf(stderr, "warning: resume: skipping corrupt checkpoint %s: %s\n", p.c_str(), e.what());
    }
  }
  if (!all.empty())
    throw Error("resume: no readable checkpoint in " + dir + " (" + std::to_string(all.size()) +
                " found, all corrupt: " + bad + ")");
  if (comm.root()) std::printf("resume: no checkpoint in %s, starting fresh\n", dir.c_str());
  return std::nullopt;
}

std::string archive_newer_checkpoints(const std::string& dir, int64_t step) {
  std::vector<std::string> newer;
  for (const auto& p : list_checkpoints(dir)) {
    long long s = 0;
    if (std::sscanf(fs::path(p).filename().string().c_str(), "ckpt_%lld", &s) == 1 && s > step) newer.push_back(p);
  }
  if (newer.empty()) return "";
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  char name[96];
  std::snprintf(name, sizeof name, "abandoned_after_step_%08lld_%s", static_cast<long long>(step), stamp);
  std::string archive = (fs::path(dir) / name).string();
  std::error_code ec;
  for (int k = 2; fs::exists(archive, ec); ++k) archive = (fs::path(dir) / name).string() + "_" + std::to_string(k);
  fs::create_directories(archive, ec);
  if (ec) throw Error(archive + ": cannot create the archive of the abandoned checkpoints: " + ec.message());
  for (const auto& p : newer) {
    fs::rename(p, fs::path(archive) / fs::path(p).filename(), ec);
    if (ec) throw Error(p + ": cannot move it to " + archive + ": " + ec.message());
  }
  if (step == 0)  // no checkpoint has step 0: a fresh run's
    std::printf("train: %s held %zu checkpoint(s) of an earlier run; this fresh run (no --resume) moved them to %s, "
                "so that its own are never mixed with them\n", dir.c_str(), newer.size(), archive.c_str());
  else
    std::printf("resume: step %lld is older than the newest checkpoint: this run starts a branch; the %zu newer "
                "checkpoint(s) (the abandoned run's, or ones that did not verify) moved to %s\n",
                static_cast<long long>(step), newer.size(), archive.c_str());
  return archive;
}

// Read once: resume 'latest' verifies candidates with this and applies the first good one.
Restored Trainer::read_resume(const std::string& path) {
  Restored r;
  r.path = path;
  // Every rank reads the weights straight into the model and only its slice of the moments into
  // the optimizer (io/README.md, "Reading a slice"); a failure is the same on every rank.
  const Slice sh = opt_.slice();
  CheckpointSliceRead how{sh.lo, sh.hi, model_.weights(), opt_.m(), opt_.v()};
  r.ck = read_checkpoint_slice(path, how, MPI_COMM_WORLD, [&](hid_t f) {
    try {
      if (h5::exists(f, "latency")) {
        h5::Id g = h5::group(f, "latency", false);
        r.lm = LatencyModel::load(g, path, &lm_.shape());
      }
      if (h5::exists(f, "lora")) {  // a LoRA checkpoint: its base, checked in Trainer::run (io/README.md)
        h5::Id g = h5::group(f, "lora", false);
        r.lora_base = h5::read_attr_string(g, "base", path);
        r.lora_base_xxh64 = h5::read_attr_string(g, "base_xxh64", path);
      }
      if (h5::exists(f, "recall/alpha")) r.alphas = h5::read_vector<double>(f, "recall/alpha", path, dims_.n_layers);
      for (size_t l = 0; l < r.alphas.size(); ++l)
        if (!(r.alphas[l] > 0 && r.alphas[l] <= 5))  // also NaN
          throw Error(path + ": dataset 'recall/alpha' holds " + std::to_string(r.alphas[l]) + " for layer " +
                      std::to_string(l) + ", expected 0 < alpha <= 5");
    } catch (...) {
      r.error = std::current_exception();
    }
  });
  return r;
}

// The data the checkpoint was trained on (its stored config) against this run's data.path: the
// cursor indexes documents of that dataset, so another one continues somewhere arbitrary.
static void check_same_data(const Checkpoint& ck, const std::string& path, const std::string& data, bool root) {
  std::string was;
  try {
    was = data_settings(Config::from_text(ck.config_toml, path + " (stored config)")).path;
  } catch (const std::exception&) {
    return;  // a config of another version: nothing to compare
  }
  if (root && was != data)
    std::fprintf(stderr, "warning: resume: %s was trained on data.path = %s, this run reads data.path = %s: its data "
                 "cursor (epoch %lld, position %lld) now points into another dataset\n",
                 path.c_str(), was.c_str(), data.c_str(), static_cast<long long>(ck.data_epoch),
                 static_cast<long long>(ck.data_cursor));
}

void Trainer::apply_checkpoint(Restored&& r) {
  Checkpoint& ck = r.ck;
  const std::string& path = r.path;
  check_weights(ck, path, model_);  // first: a model-shape mismatch is named as one
  if (r.error) std::rethrow_exception(r.error);
  // data.sources: the checkpoint's cursor must be for the same number of sources (before the
  // data.path comparison, which would only warn).
  if (ck.source_epochs.size() != weights_.size())
    throw Error(path + ": the checkpoint's data cursor is for " +
                (ck.source_epochs.empty() ? std::string("one dataset (data.path)")
                                          : std::to_string(ck.source_epochs.size()) + " data.sources") +
                ", this run reads " +
                (weights_.empty() ? std::string("one dataset (data.path)") : std::to_string(weights_.size()) + " data.sources") +
                "; expected the same data layout to resume (or start a fresh run with --init-from)");
  check_same_data(ck, path, set_.data.path, comm_.root());
  if (r.lm) lm_ = std::move(*r.lm);
  // read_resume filled the weights and this rank's slice of the moments (all of them unless
  // train.zero = 1) in place when the sizes fit; any rank count or zero setting resumes any
  // checkpoint, which holds the moments whole. Values in ck: the sizes did not fit.
  size_t n = 0;
  for (const auto& t : ck.tensors) n += t.size;
  if (n != opt_.params())
    throw Error(path + ": optimizer state holds " + std::to_string(n) + " values, the model " +
                std::to_string(opt_.params()) + " parameters");
  if (!ck.params.empty()) model_.weights() = std::move(ck.params);
  if (!ck.m.empty()) opt_.m() = std::move(ck.m);
  if (!ck.v.empty()) opt_.v() = std::move(ck.v);
  for (size_t l = 0; l < r.alphas.size(); ++l) rm_.set_alpha(int(l), r.alphas[l]);
  ck_base_ = r.lora_base, ck_base_xxh64_ = r.lora_base_xxh64;
  start_step_ = ck.step;
  cur_ = {ck.data_epoch, ck.data_cursor};
  mix_ = {ck.source_epochs, ck.source_indexes, ck.data_draws};  // the epoch orders are rebuilt from it at the next draw
  mix_orders_.clear();
  skipped_ = ck.skipped_steps;
  last_checkpoint_ = path;
  if (comm_.root()) {
    std::printf("resumed from %s at step %lld\n", path.c_str(), static_cast<long long>(ck.step));
    if (ck.ranks != comm_.size())
      std::printf("note: the checkpoint was written by %lld ranks, this run has %d: the global batches are the same, "
                  "so results agree to rounding, not bit for bit\n",
                  static_cast<long long>(ck.ranks), comm_.size());
  }
}

// The constructor's resume: find, apply, then (a branch) archive what the abandoned run left.
bool Trainer::restore(const std::string& resume) {
  std::optional<Restored> restored =
      find_resume(resume, set_.checkpoint.dir, comm_, [&](const std::string& p) { return read_resume(p); });
  // Fresh: an earlier run's checkpoints in checkpoint.dir move aside (a branch at step 0). No rank
  // reads them here (find_resume read none), so no barrier is needed before the root moves them.
  if (!restored) {
    if (comm_.root()) archive_ = archive_newer_checkpoints(set_.checkpoint.dir, 0);
    return false;
  }
  apply_checkpoint(std::move(*restored));  // also the latency model, so a resumed run plans the same
  comm_.barrier();  // every rank has read its checkpoint before the root moves any
  if (comm_.root()) {
    archive_ = archive_newer_checkpoints(set_.checkpoint.dir, start_step_);
    std::error_code ec;
    if (!archive_.empty() && fs::exists(set_.log.path, ec))
      std::printf("resume: the metrics log's rows after step %lld are dropped from %s; its copy as it was is kept in "
                  "%s\n", static_cast<long long>(start_step_), set_.log.path.c_str(), archive_.c_str());
  }
  return true;
}

}  // namespace sb
