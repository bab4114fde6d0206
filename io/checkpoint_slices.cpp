// write_checkpoint_slices (checkpoint.hpp): one checkpoint file from every rank's slice of the
// AdamW moments (train.zero = 1), no rank ever holding a whole copy of them. In three parts:
//  1. the checksum, chained through the ranks in flat order (rank 0 hashes the header, the
//     parameters and its slice of m, passes the 64-bit state to rank 1, ..., then the same for v),
//     so it equals write_checkpoint's over the gathered state without moving any data;
//  2. rank 0 writes everything but the moments into the temporary (serial HDF5: attributes, the
//     text datasets, the parameters, the trainer's groups) and creates the moment datasets with
//     their space allocated, so part 3 changes no metadata;
//  3. the moments: Collective (parallel HDF5: every rank opens the file through MPI-IO, with
//     collective metadata reads, and writes its part of each dataset in collective calls that the
//     ranks with nothing in it join with empty selections, in pieces under 1 GiB as MPI-IO's 2 GiB
//     limit on one rank's selection asks) or Stream (rank 0 receives each rank's slice in 16 MiB
//     pieces and writes them).
// Then rank 0 fsyncs and renames. Layout and checksum: io/README.md, "Checkpoint".
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/hash.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_layout.hpp"
#include "io/file_checksum.hpp"
#include "io/h5.hpp"

namespace sb {

namespace fs = std::filesystem;

namespace {

constexpr int kTag = 0x5b22;
constexpr size_t kPieceFloats = size_t(1) << 28;  // 1 GiB: one rank's selection in one MPI-IO call
constexpr size_t kStreamFloats = size_t(1) << 22;  // 16 MiB: one message of the Stream mode

void mpi(int rc, const char* what) { mpi_check(rc, what); }

struct Ranks {
  MPI_Comm comm;
  int rank = 0, size = 1;
  std::vector<uint64_t> lo, hi;  // every rank's slice
};

Ranks ranks_of(MPI_Comm comm, const CheckpointSlice& mine) {
  Ranks r{comm, 0, 1, {}, {}};
  mpi(MPI_Comm_rank(comm, &r.rank), "MPI_Comm_rank");
  mpi(MPI_Comm_size(comm, &r.size), "MPI_Comm_size");
  const uint64_t me[2] = {mine.lo, mine.lo + mine.m.size()};
  std::vector<uint64_t> all(2 * size_t(r.size));
  mpi(MPI_Allgather(me, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm), "MPI_Allgather of the slices");
  for (int i = 0; i < r.size; ++i) r.lo.push_back(all[2 * size_t(i)]), r.hi.push_back(all[2 * size_t(i) + 1]);
  return r;
}

// Part 1: the checksum, complete on rank 0 (0 elsewhere).
uint64_t chained_checksum(const Ranks& r, const Checkpoint& meta, const CheckpointSlice& mine) {
  uint64_t h = 0;
  if (r.rank == 0) h = fnv1a(mine.params.data(), mine.params.size() * sizeof(float), checksum_head(meta));
  const int next = (r.rank + 1) % r.size, prev = (r.rank + r.size - 1) % r.size;
  for (int k = 0; k < 2; ++k) {  // m, then v: each a pass 0 -> 1 -> ... -> last -> 0
    const std::span<const float> part = k ? mine.v : mine.m;
    if (r.size > 1 && (r.rank > 0 || k == 1))
      mpi(MPI_Recv(&h, 1, MPI_UINT64_T, prev, kTag, r.comm, MPI_STATUS_IGNORE), "MPI_Recv of the checksum");
    h = fnv1a(part.data(), part.size() * sizeof(float), h);
    if (r.size > 1) mpi(MPI_Send(&h, 1, MPI_UINT64_T, next, kTag, r.comm), "MPI_Send of the checksum");
  }
  if (r.size > 1 && r.rank == 0)
    mpi(MPI_Recv(&h, 1, MPI_UINT64_T, prev, kTag, r.comm, MPI_STATUS_IGNORE), "MPI_Recv of the checksum");
  return h;
}

// Selects the row-major flat range [a, b) of a dataset of extent dims[k..] inside the block whose
// leading indices are start[0..k): a partial first row, whole rows, a partial last row (OR-ed).
void add_flat(hid_t space, const std::vector<hsize_t>& dims, size_t k, std::vector<hsize_t>& start, hsize_t a,
              hsize_t b) {
  if (a >= b) return;
  hsize_t inner = 1;
  for (size_t j = k + 1; j < dims.size(); ++j) inner *= dims[j];
  auto rows = [&](hsize_t r0, hsize_t nr) {  // rows [r0, r0 + nr) of dim k, whole below it
    std::vector<hsize_t> st(start), cnt(dims.size(), 1);
    st[k] = r0, cnt[k] = nr;
    for (size_t j = k + 1; j < dims.size(); ++j) st[j] = 0, cnt[j] = dims[j];
    H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_OR, st.data(), nullptr, cnt.data(), nullptr));
  };
  const hsize_t ra = a / inner, rb = b / inner;
  hsize_t full = ra;
  if (a % inner) {
    start[k] = ra;
    add_flat(space, dims, k + 1, start, a % inner, std::min(b - ra * inner, inner));
    if (rb == ra) return;
    full = ra + 1;
  }
  if (rb > full) rows(full, rb - full);
  if (b % inner) {
    start[k] = rb;
    add_flat(space, dims, k + 1, start, 0, b % inner);
  }
}

}  // namespace

void transfer_flat(hid_t ds, const CheckpointTensor& t, hsize_t a, hsize_t b, float* data, hid_t dxpl, bool write) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  if (dims.empty()) dims = {hsize_t(t.size)};
  h5::Id fspace(H5_CHECK(H5Dget_space(ds)));
  H5_CHECK(H5Sselect_none(fspace));
  std::vector<hsize_t> start(dims.size(), 0);
  add_flat(fspace, dims, 0, start, a, b);
  const hsize_t n = std::max<hsize_t>(b - a, 1);
  h5::Id mspace(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
  if (b <= a) H5_CHECK(H5Sselect_none(mspace));
  float none = 0;
  float* p = b > a ? data : &none;
  H5_CHECK(write ? H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, p)
                 : H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, p));
}

namespace {

// The writer's use of transfer_flat (which takes a mutable pointer for both directions).
void write_flat(hid_t ds, const CheckpointTensor& t, hsize_t a, hsize_t b, const float* data, hid_t dxpl) {
  transfer_flat(ds, t, a, b, const_cast<float*>(data), dxpl, true);
}

// Part 2 (rank 0): the file without the moments' values.
void write_skeleton(const std::string& tmp, const Checkpoint& meta, const CheckpointSlice& mine, uint64_t sum,
                    const std::function<void(hid_t)>& extra) {
  h5::Id f = h5::create(tmp);
  write_meta(f, meta, mine.params.size(), sum);
  h5::Id params = h5::group(f, "params", true), mg = h5::group(f, "optim/m", true), vg = h5::group(f, "optim/v", true);
  h5::Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
  H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));  // the space exists before part 3 writes
  H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  for (const auto& t : meta.tensors) {
    if (t.offset + t.size > mine.params.size()) throw Error("checkpoint: tensor '" + t.name + "' lies past the parameters");
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::Id space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
    for (hid_t g : {params.get(), mg.get(), vg.get()}) {
      h5::Id ds(H5_CHECK(H5Dcreate2(g, t.name.c_str(), H5T_NATIVE_FLOAT, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
      for (size_t a = 0; g == params.get() && a < t.size; a += kPieceFloats)
        write_flat(ds, t, a, std::min(t.size, a + kPieceFloats), mine.params.data() + t.offset + a, H5P_DEFAULT);
    }
  }
  if (extra) extra(f);
  h5::write_attr(f, "checksum_extra", std::to_string(checksum_extra(f, tmp)));
  if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) throw Error(tmp + ": flush failed");
}

// The part of `t` in [lo, hi) of the flat buffer, relative to the tensor.
std::pair<size_t, size_t> overlap(const CheckpointTensor& t, size_t lo, size_t hi) {
  const size_t a = std::max(t.offset, lo), b = std::min(t.offset + t.size, hi);
  return a < b ? std::pair{a - t.offset, b - t.offset} : std::pair{size_t(0), size_t(0)};
}

// Part 3, Stream: rank 0 writes every rank's slice, received in pieces, in rank order.
void stream_moments(const std::string& tmp, const Ranks& r, const Checkpoint& meta, const CheckpointSlice& mine) {
  h5::Id f;
  std::vector<h5::Id> ds[2];
  std::vector<float> buf;
  std::string failed;  // rank 0: the first failure; it still receives every piece (see below)
  if (r.rank == 0) try {
      hid_t fid = H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      if (fid < 0) throw Error(tmp + ": cannot reopen to write the optimizer state");
      f = h5::Id(fid);
      for (int k = 0; k < 2; ++k)
        for (const auto& t : meta.tensors)
          ds[k].emplace_back(H5_CHECK(H5Dopen2(f, ((k ? "optim/v/" : "optim/m/") + t.name).c_str(), H5P_DEFAULT)));
    } catch (const std::exception& e) {
      failed = e.what();
    }
  for (int k = 0; k < 2; ++k) {
    const std::span<const float> part = k ? mine.v : mine.m;
    for (int src = 0; src < r.size; ++src)
      for (uint64_t at = r.lo[size_t(src)]; at < r.hi[size_t(src)]; at += kStreamFloats) {
        const size_t n = size_t(std::min<uint64_t>(kStreamFloats, r.hi[size_t(src)] - at));
        if (r.rank == src && src != 0)
          mpi(MPI_Send(part.data() + (at - mine.lo), int(n), MPI_FLOAT, 0, kTag, r.comm), "MPI_Send of a slice");
        if (r.rank != 0) continue;
        const float* data = src == 0 ? part.data() + (at - mine.lo) : nullptr;
        if (src != 0) {
          buf.resize(n);
          mpi(MPI_Recv(buf.data(), int(n), MPI_FLOAT, src, kTag, r.comm, MPI_STATUS_IGNORE), "MPI_Recv of a slice");
          data = buf.data();
        }
        try {
          for (size_t i = 0; i < meta.tensors.size() && failed.empty(); ++i) {
            const auto& t = meta.tensors[i];
            const auto [a, b] = overlap(t, at, at + n);
            if (a < b) write_flat(ds[k][i], t, a, b, data + (t.offset + a - at), H5P_DEFAULT);
          }
        } catch (const std::exception& e) {
          failed = e.what();  // keep receiving: a sender blocked in MPI_Send would never reach agree()
        }
      }
  }
  if (!failed.empty()) throw Error(failed);
  if (f.valid() && H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) throw Error(tmp + ": flush failed");
}

#ifdef SB_HDF5_PARALLEL
// Part 3, Collective: each rank its own slice, through MPI-IO.
void collective_moments(const std::string& tmp, const Ranks& r, const Checkpoint& meta, const CheckpointSlice& mine) {
  h5::Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  H5_CHECK(H5Pset_fapl_mpio(fapl, r.comm, MPI_INFO_NULL));
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));  // rank 0 reads the metadata, broadcasts it
  H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
  hid_t fid = H5Fopen(tmp.c_str(), H5F_ACC_RDWR, fapl);
  if (fid < 0) throw Error(tmp + ": cannot open through MPI-IO to write the optimizer state");
  h5::Id f(fid);
  h5::Id dxpl(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
  for (int k = 0; k < 2; ++k) {
    const std::span<const float> part = k ? mine.v : mine.m;
    for (const auto& t : meta.tensors) {
      h5::Id ds(H5_CHECK(H5Dopen2(f, ((k ? "optim/v/" : "optim/m/") + t.name).c_str(), H5P_DEFAULT)));
      const auto [a, b] = overlap(t, mine.lo, mine.lo + part.size());
      // The same number of calls on every rank: enough pieces for the whole tensor.
      for (size_t p = 0; p < std::max<size_t>(1, (t.size + kPieceFloats - 1) / kPieceFloats); ++p) {
        const size_t pa = std::min(b, a + p * kPieceFloats), pb = std::min(b, pa + kPieceFloats);
        write_flat(ds, t, pa, pb, pb > pa ? part.data() + (t.offset + pa - mine.lo) : nullptr, dxpl);
      }
    }
  }
  if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) throw Error(tmp + ": flush (MPI_File_sync) failed");
}
#endif

}  // namespace

void agree(MPI_Comm comm, std::string& err) {
  int rank = 0, size = 1;
  mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  int mine = err.empty() ? size : rank, first = size;
  mpi_check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce of the outcome");
  if (first == size) return;
  int64_t n = int64_t(err.size());
  mpi_check(MPI_Bcast(&n, 1, MPI_INT64_T, first, comm), "MPI_Bcast of the error");
  err.resize(size_t(n));
  mpi_check(MPI_Bcast(err.data(), int(n), MPI_CHAR, first, comm), "MPI_Bcast of the error");
}

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(std::string("checkpoint: ") + what + " failed (MPI error " + std::to_string(rc) + ")");
}

void write_checkpoint_slices(const std::string& path, const Checkpoint& meta, const CheckpointSlice& mine,
                              MPI_Comm comm, CheckpointIo how, const std::function<void(hid_t)>& extra) {
  const Ranks r = ranks_of(comm, mine);
  const std::string tmp = path + ".tmp";
  const fs::path p(path);
  h5::quiet_errors();
  std::string err;
  auto step = [&](const std::function<void()>& fn) {  // one part: run, then agree on its outcome
    if (err.empty()) try {
        fn();
      } catch (const std::exception& e) {
        err = e.what();
      }
    agree(r.comm, err);
  };
  step([&] {
    for (int i = 0; i < r.size; ++i)
      if (r.lo[size_t(i)] != (i ? r.hi[size_t(i) - 1] : 0) || r.hi[size_t(i)] < r.lo[size_t(i)] ||
          mine.v.size() != mine.m.size())
        throw Error("checkpoint: the ranks' optimizer slices do not tile the parameters in rank order");
    if (r.rank == 0 && r.hi.back() != mine.params.size())
      throw Error("checkpoint: the optimizer slices cover " + std::to_string(r.hi.back()) + " values, the parameters " +
                  std::to_string(mine.params.size()));
    if (how == CheckpointIo::Collective && !kCollectiveCheckpoints)
      throw Error("checkpoint: this build's HDF5 is serial, it cannot write collectively (use the Stream mode)");
  });
  const uint64_t sum = err.empty() ? chained_checksum(r, meta, mine) : 0;
  step([&] {
    if (r.rank != 0) return;
    std::error_code ec;
    if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
    if (ec) throw Error(path + ": cannot create checkpoint directory: " + ec.message());
    write_skeleton(tmp, meta, mine, sum, extra);
  });
  step([&] {
#ifdef SB_HDF5_PARALLEL
    if (how == CheckpointIo::Collective) return collective_moments(tmp, r, meta, mine);
#endif
    stream_moments(tmp, r, meta, mine);
  });
  step([&] {
    if (r.rank != 0) return;
    stamp_file_checksum(tmp);  // every rank's part is written and the file closed: checksum, fsync
    std::error_code ec;
    fs::rename(tmp, p, ec);
    if (ec) throw Error(path + ": cannot move the checkpoint into place: " + ec.message());
    fsync_path(p.has_parent_path() ? p.parent_path().string() : ".", true);
  });
  if (err.empty()) return;
  if (r.rank == 0) {
    std::error_code ec;
    fs::remove(tmp, ec);
  }
  throw Error(path + ": checkpoint write failed, previous checkpoints untouched: " + err);
}

}  // namespace sb
