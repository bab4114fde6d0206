// read_checkpoint_slice (checkpoint.hpp): a resume that reads on each rank only what it keeps: the
// parameters whole (every rank computes with them) and its slice of the AdamW moments. In parts:
//  1. every rank reads the metadata with serial HDF5 (format, config, tensor names and shapes)
//     and runs the caller's `extra` groups;
//  2. the values: through MPI-IO with collective reads (parallel HDF5), or serial reads, each
//     call under `piece_floats` values (HDF5 1.10's MPI-IO limits one rank's selection to 2 GiB);
//     the ranks make the same number of calls per dataset, empty selections included;
//  3. the checksum, the FNV-1a of write_checkpoint (sequential, so chained): rank 0 hashes the
//     header and the parameters, each rank its segment of m in rank order passing the 64-bit
//     state on, then the same for v; rank 0 compares and every rank learns the verdict.
// When the slices tile the parameters in rank order (train.zero = 1), a rank's segment is its
// slice; otherwise (e.g. train.zero = 0, every rank everything) the segments split the values
// evenly and a rank reads whatever of its segment lies outside its slice too.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/hash.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_layout.hpp"
#include "io/h5.hpp"

namespace sb {

namespace {

constexpr int kTag = 0x5b23;

// Opens `path` for the value reads: MPI-IO (collective metadata, collective transfers) or serial.
h5::Id open_values(const std::string& path, MPI_Comm comm, h5::Id& dxpl) {
  h5::Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  dxpl = h5::Id(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
#ifdef SB_HDF5_PARALLEL
  H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));  // rank 0 reads the metadata, broadcasts it
  H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
#else
  (void)comm;
#endif
  hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (fid < 0) throw Error(path + ": cannot open to read the checkpoint's values (truncated or corrupt?)");
  return h5::Id(fid);
}

}  // namespace

Checkpoint read_checkpoint_slice(const std::string& path, const CheckpointSliceRead& how, MPI_Comm comm,
                                 const std::function<void(hid_t)>& extra) {
  int rank = 0, size = 1;
  mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  h5::quiet_errors();
  std::string err;
  auto step = [&](const std::function<void()>& fn) {  // one part: run, agree, stop everyone on a failure
    try {
      fn();
    } catch (const std::exception& e) {
      err = e.what();
    }
    agree(comm, err);
    if (!err.empty()) throw Error(err);
  };
  Checkpoint ck;
  size_t n = 0;
  step([&] {  // part 0: rank 0 checks the file (input-file rule, whole-file checksum) for every rank
    if (rank == 0) h5::check_file(path, "a checkpoint");
  });
  step([&] {  // part 1
    h5::Id f = h5::open_read_checked(path);
    ck = read_meta(f, path);
    n = read_shapes(f, ck, path);
    if (extra) extra(f);
  });
  // The segments each rank hashes, and what it reads: its slice, grown to cover its segment.
  const size_t lo = std::min(how.lo, n), hi = std::min(std::max(how.hi, lo), n);
  std::vector<uint64_t> all(2 * size_t(size));
  const uint64_t me[2] = {lo, hi};
  mpi_check(MPI_Allgather(me, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm), "MPI_Allgather of the slices");
  bool tiles = all[2 * size_t(size) - 1] == n;
  for (int i = 0; i < size; ++i) tiles = tiles && all[2 * size_t(i)] == (i ? all[2 * size_t(i) - 1] : 0);
  const size_t seg_lo = tiles ? lo : n * size_t(rank) / size_t(size);
  const size_t seg_hi = tiles ? hi : n * size_t(rank + 1) / size_t(size);
  const size_t rlo = seg_lo < seg_hi ? std::min(lo, seg_lo) : lo, rhi = std::max(hi, seg_hi);
  const bool exact = rlo == lo && rhi == hi;
  auto dest = [&](std::span<float> into, std::vector<float>& own, size_t count) {
    if (exact && into.size() == count) return into.data();
    own.resize(count);
    return own.data();
  };
  float* P = how.params.size() == n ? how.params.data() : (ck.params.resize(n), ck.params.data());
  float* M = dest(how.m, ck.m, rhi - rlo);
  float* V = dest(how.v, ck.v, rhi - rlo);
  const size_t piece = std::max<size_t>(how.piece_floats, 1);
  size_t largest = 0;
  step([&] {  // part 2
    h5::Id dxpl;
    h5::Id f = open_values(path, comm, dxpl);
    for (const char* g : {"params/", "optim/m/", "optim/v/"})
      for (const auto& t : ck.tensors) {
        h5::Id ds(H5_CHECK(H5Dopen2(f, (g + t.name).c_str(), H5P_DEFAULT)));
        const bool whole = g[0] == 'p';
        const size_t a = whole ? 0 : std::clamp(rlo, t.offset, t.offset + t.size) - t.offset;
        const size_t b = whole ? t.size : std::clamp(rhi, t.offset, t.offset + t.size) - t.offset;
        float* base = b <= a ? nullptr : whole ? P + t.offset : (g[6] == 'm' ? M : V) + (t.offset + a - rlo);
        // The same number of calls on every rank: enough pieces for the whole tensor.
        for (size_t p = 0; p < std::max<size_t>(1, (t.size + piece - 1) / piece); ++p) {
          const size_t pa = std::min(b, a + p * piece), pb = std::min(b, pa + piece);
          transfer_flat(ds, t, pa, pb, pb > pa ? base + (pa - a) : nullptr, dxpl, false);
          largest = std::max(largest, pb - pa);
        }
      }
  });
  if (how.largest_read) *how.largest_read = largest;
  step([&] {  // part 3: the chain, then rank 0's verdict
    uint64_t h = rank == 0 ? fnv1a(P, n * sizeof(float), checksum_head(ck)) : 0;
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (const float* part : {M, V}) {
      if (size > 1 && (rank > 0 || part == V))
        mpi_check(MPI_Recv(&h, 1, MPI_UINT64_T, prev, kTag, comm, MPI_STATUS_IGNORE), "MPI_Recv of the checksum");
      if (seg_hi > seg_lo) h = fnv1a(part + (seg_lo - rlo), (seg_hi - seg_lo) * sizeof(float), h);
      if (size > 1) mpi_check(MPI_Send(&h, 1, MPI_UINT64_T, next, kTag, comm), "MPI_Send of the checksum");
    }
    if (size > 1 && rank == 0)
      mpi_check(MPI_Recv(&h, 1, MPI_UINT64_T, prev, kTag, comm, MPI_STATUS_IGNORE), "MPI_Recv of the checksum");
    if (rank == 0) verify_checksums(h5::open_read_checked(path), path, h);
  });
  if (!exact) {  // keep [lo, hi) only (into the caller's spans when they fit)
    for (auto [own, into] : {std::pair{&ck.m, how.m}, std::pair{&ck.v, how.v}}) {
      std::vector<float> keep(own->begin() + long(lo - rlo), own->begin() + long(hi - rlo));
      if (into.size() == keep.size()) std::copy(keep.begin(), keep.end(), into.begin()), keep.clear();
      *own = std::move(keep);
    }
  }
  return ck;
}

}  // namespace sb
