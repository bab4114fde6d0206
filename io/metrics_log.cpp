#include "io/metrics_log.hpp"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/error.hpp"
#include "base/input_file.hpp"

namespace sb {

static h5::Id step_type() {
  h5::Id t(H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(StepRow))));
#define F(name, type) H5_CHECK(H5Tinsert(t, #name, HOFFSET(StepRow, name), type))
  F(step, H5T_NATIVE_INT64); F(loss, H5T_NATIVE_DOUBLE); F(grad_norm, H5T_NATIVE_DOUBLE);
  F(lr, H5T_NATIVE_DOUBLE); F(tokens, H5T_NATIVE_INT64); F(makespan_ms, H5T_NATIVE_DOUBLE);
  F(tokens_per_s, H5T_NATIVE_DOUBLE); F(imbalance, H5T_NATIVE_DOUBLE); F(bubble, H5T_NATIVE_DOUBLE);
  F(density, H5T_NATIVE_DOUBLE); F(recall, H5T_NATIVE_DOUBLE); F(plan_ms, H5T_NATIVE_DOUBLE);
  F(pred_error, H5T_NATIVE_DOUBLE); F(skipped, H5T_NATIVE_INT32); F(mfu, H5T_NATIVE_DOUBLE);
  F(peak_mem_gib, H5T_NATIVE_DOUBLE); F(recall_true, H5T_NATIVE_DOUBLE);
#undef F
  return t;
}

static h5::Id rank_type() {
  h5::Id t(H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(RankRow))));
#define F(name, type) H5_CHECK(H5Tinsert(t, #name, HOFFSET(RankRow, name), type))
  F(step, H5T_NATIVE_INT64); F(rank, H5T_NATIVE_INT32); F(micro_batches, H5T_NATIVE_INT32);
  F(tokens, H5T_NATIVE_INT64); F(compute_ms, H5T_NATIVE_DOUBLE); F(idle_ms, H5T_NATIVE_DOUBLE);
  F(predicted_ms, H5T_NATIVE_DOUBLE); F(mean_budget, H5T_NATIVE_DOUBLE); F(min_budget, H5T_NATIVE_DOUBLE);
  F(max_budget, H5T_NATIVE_DOUBLE); F(density, H5T_NATIVE_DOUBLE); F(recall, H5T_NATIVE_DOUBLE);
#undef F
  return t;
}

static h5::Id source_type() {
  h5::Id t(H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(SourceRow))));
#define F(name, type) H5_CHECK(H5Tinsert(t, #name, HOFFSET(SourceRow, name), type))
  F(step, H5T_NATIVE_INT64); F(source, H5T_NATIVE_INT32); F(docs, H5T_NATIVE_INT64); F(tokens, H5T_NATIVE_INT64);
#undef F
  return t;
}

// An extendible (steps, width) table of compound rows, chunked by 16 steps.
static h5::Id create_table(hid_t file, const char* name, hid_t type, int width) {
  hsize_t d2[2] = {0, hsize_t(width)}, m2[2] = {H5S_UNLIMITED, hsize_t(width)}, c2[2] = {16, hsize_t(std::max(1, width))};
  h5::Id s2(H5_CHECK(H5Screate_simple(2, d2, m2)));
  h5::Id p2(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(p2, 2, c2));
  return h5::Id(H5_CHECK(H5Dcreate2(file, name, type, s2, H5P_DEFAULT, p2, H5P_DEFAULT)));
}

MetricsLog::MetricsLog(const std::string& path, int ranks, bool resume, int64_t resume_step, int sources)
    : path_(path), ranks_(ranks), sources_(sources), step_type_(step_type()), rank_type_(rank_type()),
      source_type_(source_type()) {
  h5::quiet_errors();
  namespace fs = std::filesystem;
  h5::Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  // SWMR needs the 1.10 file format; readers use h5py's swmr=True.
  H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
  if (resume && fs::exists(path)) {
    check_input_file(path, "a metrics log (log.path)");  // a FIFO would block the open forever
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
    if (f < 0) throw Error(path + ": cannot reopen the metrics log to resume (log.path)");
    file_ = h5::Id(f);
    if (!h5::exists(file_, "steps") || !h5::exists(file_, "ranks"))
      throw Error(path + ": not a SparseBalance metrics log (missing /steps or /ranks)");
    steps_ = h5::Id(H5_CHECK(H5Dopen2(file_, "steps", H5P_DEFAULT)));
    ranks_ds_ = h5::Id(H5_CHECK(H5Dopen2(file_, "ranks", H5P_DEFAULT)));
    h5::Id space(H5_CHECK(H5Dget_space(ranks_ds_)));
    hsize_t dims[2];
    H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr));
    if (int(dims[1]) != ranks)
      throw Error(path + ": the log has " + std::to_string(dims[1]) + " ranks per row, this run has " +
                  std::to_string(ranks) + " (use a new log.path)");
    int logged_sources = 0;
    if (h5::exists(file_, "sources")) {
      sources_ds_ = h5::Id(H5_CHECK(H5Dopen2(file_, "sources", H5P_DEFAULT)));
      h5::Id ss(H5_CHECK(H5Dget_space(sources_ds_)));
      H5_CHECK(H5Sget_simple_extent_dims(ss, dims, nullptr));
      logged_sources = int(dims[1]);
    }
    if (logged_sources != sources)
      throw Error(path + ": the log has " + std::to_string(logged_sources) + " data sources per row, this run has " +
                  std::to_string(sources) + " (use a new log.path)");
    // Drop rows of steps after the checkpoint we resume from: they will be run again.
    auto tables = read_metrics(path);
    int64_t keep = 0;
    while (keep < int64_t(tables.steps.size()) && tables.steps[keep].step <= resume_step) ++keep;
    rows_ = keep;
    hsize_t d1 = hsize_t(keep), d2[2] = {hsize_t(keep), hsize_t(ranks)};
    H5_CHECK(H5Dset_extent(steps_, &d1));
    H5_CHECK(H5Dset_extent(ranks_ds_, d2));
    if (sources > 0) {
      hsize_t d3[2] = {hsize_t(keep), hsize_t(sources)};
      H5_CHECK(H5Dset_extent(sources_ds_, d3));
    }
  } else {
    std::error_code ec;
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
    if (ec) throw Error(path + ": cannot create the directory of the metrics log (log.path): " + ec.message());
    errno = 0;
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (f < 0)
      throw Error(path + ": cannot create the metrics log (log.path)" + (errno ? ": " + std::string(std::strerror(errno)) : ""));
    file_ = h5::Id(f);
    h5::write_attr(file_, "format", std::string("sparsebalance-metrics"));
    h5::write_attr(file_, "version", int64_t(1));
    h5::write_attr(file_, "ranks", int64_t(ranks));
    if (sources > 0) sources_ds_ = create_table(file_, "sources", source_type_, sources);
    hsize_t d0 = 0, dmax = H5S_UNLIMITED, chunk = 64;
    h5::Id s1(H5_CHECK(H5Screate_simple(1, &d0, &dmax)));
    h5::Id p1(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    H5_CHECK(H5Pset_chunk(p1, 1, &chunk));
    steps_ = h5::Id(H5_CHECK(H5Dcreate2(file_, "steps", step_type_, s1, H5P_DEFAULT, p1, H5P_DEFAULT)));
    ranks_ds_ = create_table(file_, "ranks", rank_type_, ranks);
  }
  // From here on readers may open the file while we append.
  H5_CHECK(H5Fstart_swmr_write(file_));
}

// HDF5 reports a failed write without its cause: name the file, and say "disk full" when it is.
static std::string write_failure(const std::string& path, const char* what) {
  const int err = errno;
  std::string msg = path + ": writing the metrics log (log.path) failed in " + what;
  struct statvfs st {};
  const auto dir = std::filesystem::path(path).parent_path();
  const bool full = err == ENOSPC || (statvfs(dir.empty() ? "." : dir.c_str(), &st) == 0 && st.f_bavail == 0);
  if (full) return msg + ": disk full (ENOSPC); free space or set log.path elsewhere, then --resume";
  return msg + (err ? ": " + std::string(std::strerror(err)) : "");
}

void MetricsLog::append(const StepRow& step, std::span<const RankRow> ranks, std::span<const SourceRow> sources) {
  if (int(ranks.size()) != ranks_) throw std::logic_error("MetricsLog::append: wrong number of rank rows");
  if (int(sources.size()) != sources_) throw std::logic_error("MetricsLog::append: wrong number of source rows");
  errno = 0;
  try {
    append_rows(step, ranks, sources);
  } catch (const std::exception&) {
    throw Error(write_failure(path_, "append"));
  }
}

void MetricsLog::append_rows(const StepRow& step, std::span<const RankRow> ranks, std::span<const SourceRow> sources) {
  hsize_t n1 = hsize_t(rows_ + 1), start1 = hsize_t(rows_), one = 1;
  H5_CHECK(H5Dset_extent(steps_, &n1));
  {
    h5::Id fs(H5_CHECK(H5Dget_space(steps_)));
    H5_CHECK(H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start1, nullptr, &one, nullptr));
    h5::Id ms(H5_CHECK(H5Screate_simple(1, &one, nullptr)));
    H5_CHECK(H5Dwrite(steps_, step_type_, ms, fs, H5P_DEFAULT, &step));
  }
  hsize_t n2[2] = {n1, hsize_t(ranks_)}, start2[2] = {start1, 0}, cnt2[2] = {1, hsize_t(ranks_)};
  H5_CHECK(H5Dset_extent(ranks_ds_, n2));
  {
    h5::Id fs(H5_CHECK(H5Dget_space(ranks_ds_)));
    H5_CHECK(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start2, nullptr, cnt2, nullptr));
    h5::Id ms(H5_CHECK(H5Screate_simple(2, cnt2, nullptr)));
    H5_CHECK(H5Dwrite(ranks_ds_, rank_type_, ms, fs, H5P_DEFAULT, ranks.data()));
  }
  if (sources_ > 0) {
    hsize_t n3[2] = {n1, hsize_t(sources_)}, cnt3[2] = {1, hsize_t(sources_)};
    H5_CHECK(H5Dset_extent(sources_ds_, n3));
    h5::Id fs(H5_CHECK(H5Dget_space(sources_ds_)));
    H5_CHECK(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start2, nullptr, cnt3, nullptr));
    h5::Id ms(H5_CHECK(H5Screate_simple(2, cnt3, nullptr)));
    H5_CHECK(H5Dwrite(sources_ds_, source_type_, ms, fs, H5P_DEFAULT, sources.data()));
  }
  ++rows_;
}

void MetricsLog::flush() {
  errno = 0;
  if (H5Dflush(steps_) < 0 || H5Dflush(ranks_ds_) < 0 || (sources_ > 0 && H5Dflush(sources_ds_) < 0) || H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0)
    throw Error(write_failure(path_, "flush"));
}

// A name no earlier move-aside has used: an older one holds rows nothing else has.
static std::string unused_name(const std::string& base) {
  std::error_code ec;
  std::string name = base;
  for (int k = 2; std::filesystem::exists(name, ec); ++k) name = base + "." + std::to_string(k);
  return name;
}

std::unique_ptr<MetricsLog> open_metrics_log(const std::string& path, int ranks, bool resume, int64_t step,
                                             const std::string& archive_copy, std::span<const std::string> inputs,
                                             int sources) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error("log.path is empty: expected the path of the HDF5 metrics log, e.g. runs/x/metrics.h5");
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(path + ": log.path names a directory, expected a file path");
  for (const auto& in : inputs)
    if (fs::equivalent(path, in, ec))
      throw Error(path + ": log.path names an input of this run (" + in + "); expected a file of its own");
  if (!resume) {
    // A fresh run never replaces an earlier run's log: it goes with that run's checkpoints into
    // archive_copy, or beside as PATH.earlier (then .2, .3, ...).
    if (fs::exists(path, ec)) {
      std::string aside = archive_copy;
      if (!aside.empty()) fs::rename(path, aside, ec);  // fails across file systems: then beside it
      if (aside.empty() || ec) fs::rename(path, aside = unused_name(path + ".earlier"), ec);
      if (ec) throw Error(path + ": cannot move the earlier run's metrics log to " + aside + ": " + ec.message());
      std::printf("log.path: %s held an earlier run's metrics log; moved it to %s\n", path.c_str(), aside.c_str());
    }
    return std::make_unique<MetricsLog>(path, ranks, false, step, sources);
  }
  if (!archive_copy.empty() && fs::exists(path, ec)) {
    fs::copy_file(path, archive_copy, fs::copy_options::none, ec);
    if (ec) throw Error(path + ": cannot keep a copy of the metrics log at " + archive_copy + ": " + ec.message());
  }
  try {
    return std::make_unique<MetricsLog>(path, ranks, true, step, sources);
  } catch (const std::exception&) {
    // A killed job's log: clear its "open for write" superblock flag (h5clear), then retry.
    h5::quiet_errors();
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    hbool_t clear = 1;
    if (fapl >= 0 && H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) >= 0 &&
        H5Pset(fapl, "clear_status_flags", &clear) >= 0) {
      hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
      if (f >= 0) H5Fclose(f);
    }
    if (fapl >= 0) H5Pclose(fapl);
  }
  try {
    return std::make_unique<MetricsLog>(path, ranks, true, step, sources);
  } catch (const std::exception& e) {
    const std::string aside = unused_name(path + ".before_step" + std::to_string(step + 1));
    fs::rename(path, aside, ec);
    if (ec) throw;
    std::fprintf(stderr, "warning: cannot continue the metrics log (%s); moved it to %s and started a new one\n",
                 e.what(), aside.c_str());
    return std::make_unique<MetricsLog>(path, ranks, false, step, sources);
  }
}

MetricsTables read_metrics(const std::string& path) {
  h5::quiet_errors();
  h5::Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
  check_input_file(path, "a metrics log");
  hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl);
  if (fid < 0) fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) throw Error(path + ": not a readable HDF5 file");
  h5::Id f(fid);
  MetricsTables t;
  for (const char* name : {"steps", "ranks"})
    if (!h5::exists(f, name)) throw Error(path + ": missing dataset '" + name + "' (not a metrics log?)");
  h5::Id st(H5_CHECK(H5Dopen2(f, "steps", H5P_DEFAULT))), rk(H5_CHECK(H5Dopen2(f, "ranks", H5P_DEFAULT)));
  h5::Id s1(H5_CHECK(H5Dget_space(st))), s2(H5_CHECK(H5Dget_space(rk)));
  hsize_t n = 0, d2[2];
  H5_CHECK(H5Sget_simple_extent_dims(s1, &n, nullptr));
  H5_CHECK(H5Sget_simple_extent_dims(s2, d2, nullptr));
  t.n_ranks = int(d2[1]);
  t.steps.resize(n);
  t.ranks.resize(d2[0] * d2[1]);
  if (n) H5_CHECK(H5Dread(st, step_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.steps.data()));
  if (!t.ranks.empty()) H5_CHECK(H5Dread(rk, rank_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.ranks.data()));
  if (h5::exists(f, "sources")) {
    h5::Id sd(H5_CHECK(H5Dopen2(f, "sources", H5P_DEFAULT)));
    h5::Id s3(H5_CHECK(H5Dget_space(sd)));
    hsize_t d3[2];
    H5_CHECK(H5Sget_simple_extent_dims(s3, d3, nullptr));
    t.n_sources = int(d3[1]);
    t.sources.resize(d3[0] * d3[1]);
    if (!t.sources.empty()) H5_CHECK(H5Dread(sd, source_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.sources.data()));
  }
  return t;
}

}  // namespace sb
