// Checkpoint write time and peak host memory for the configs/gpu_0p5b.toml model shape (~0.47B
// parameters): today's whole-file writer against the sliced one of train.zero = 1. Not a Google
// Benchmark (one write is the measurement); bench/studies/checkpoint_zero.sh runs it, bench/results/2026-12-01-checkpoint-writers.md and -readers.md have
// the figures.
//   mpirun -np R build/bench/bench_checkpoint plain|collective|stream|read-whole|read-slice|verify OUT_DIR [LAYERS]
// plain:      rank 0 holds params, m, v whole (the Checkpoint the trainer fills) and calls
//             write_checkpoint (the file built in memory, then written); the other ranks hold
//             nothing here and wait (in training each holds its own whole state too).
// collective: every rank holds all params and its 1/R slice of m, v (train.zero = 1) and calls
//             write_checkpoint_slices(..., Collective); stream: the same, through rank 0.
// read-whole / read-slice: a resume of train.zero = 1 (the file first written collectively, not
//             timed): every rank holds the weights and its slice of m, v, and reads the checkpoint
//             with read_checkpoint (today: the whole file into a Checkpoint, then the weights and
//             its slice copied out) or read_checkpoint_slice (weights in place, its slice only).
// verify:     the whole-file checksum check every reader runs before libhdf5 opens a file
//             (h5::check_file, io/file_checksum.hpp) on the plain file (written first, not timed),
//             against one plain sequential read of the same file (raw_s: the disk's or page cache's speed).
// Prints one line per rank count: seconds of the write, and VmHWM (peak resident set) of rank 0
// and the largest of any rank, before the write (the state) and after.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/cpp/bench_flags.hpp"
#include "io/checkpoint.hpp"
#include "io/h5.hpp"
#include "src/comm/comm.hpp"
#include "src/model/model.hpp"

namespace {

double vmhwm_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

void fill(std::vector<float>& v, uint32_t seed) {  // touched pages, values that do not compress
  for (auto& x : v) seed = seed * 1664525u + 1013904223u, x = float(seed >> 8) * 1e-7f;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 3) {
    if (rank == 0)
      std::fprintf(stderr, "usage: bench_checkpoint plain|collective|stream|read-whole|read-slice|verify OUT_DIR [LAYERS]\n");
    MPI_Finalize();
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  // An unknown mode or a LAYERS that is not a count must stop the run, not time another one.
  long long layers = 24;
  const bool mode_ok = mode == "plain" || mode == "collective" || mode == "stream" || mode == "read-whole" ||
                       mode == "read-slice" || mode == "verify";
  if (!mode_ok || argc > 4 || (argc > 3 && !sb::bench::whole(argv[3], 1, 100000, &layers))) {
    if (rank == 0) {
      if (!mode_ok)
        std::fprintf(stderr, "bench_checkpoint: mode %s: expected plain, collective, stream, read-whole, read-slice or verify\n",
                     mode.c_str());
      else if (argc > 4) std::fprintf(stderr, "bench_checkpoint: unexpected argument %s\n", argv[4]);
      else std::fprintf(stderr, "bench_checkpoint: LAYERS %s: expected a whole number >= 1\n", argv[3]);
    }
    MPI_Finalize();
    return 2;
  }
  sb::ModelDims d;  // configs/gpu_0p5b.toml
  d.n_layers = int(layers), d.d_model = 1280, d.n_heads = 10, d.n_kv_heads = 2;
  d.head_dim = 128, d.ffn_dim = 3584, d.vocab = 32768, d.tied = true;
  const sb::ParamLayout layout(d);
  sb::Checkpoint ck;
  ck.step = 1, ck.ranks = size, ck.config_toml = "# bench_checkpoint\n";
  size_t n = 0;
  for (const auto& p : layout.params) ck.tensors.push_back({p.name, p.shape, p.offset, p.size}), n = p.offset + p.size;
  const std::string path = sb::checkpoint_path(dir, 1);
  std::vector<float> params, m, v;
  const sb::Slice sh = sb::slice_of(n, rank, size);
  if (mode == "plain" || mode == "verify") {
    if (rank == 0) {
      ck.params.resize(n), ck.m.resize(n), ck.v.resize(n);
      fill(ck.params, 1), fill(ck.m, 2), fill(ck.v, 3);
    }
  } else {
    params.resize(n), m.resize(sh.size()), v.resize(sh.size());
    fill(params, 1), fill(m, 2 + uint32_t(rank)), fill(v, 3 + uint32_t(rank));
  }
  const bool read = mode.starts_with("read-") || mode == "verify";
  double raw_s = 0;
  if (mode == "verify" && rank == 0) {
    sb::write_checkpoint(path, ck);
    std::ifstream in(path, std::ios::binary);  // the baseline: one sequential read, 4 MiB at a time
    std::vector<char> buf(4u << 20);
    const double r0 = MPI_Wtime();
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
    }
    raw_s = MPI_Wtime() - r0;
  }
  if (mode.starts_with("read-")) sb::write_checkpoint_slices(path, ck, {params, sh.lo, m, v}, MPI_COMM_WORLD, sb::CheckpointIo::Collective);
  const double before = vmhwm_mib();
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  if (mode == "read-whole") {  // Trainer::apply_checkpoint before read_checkpoint_slice
    sb::Checkpoint got = sb::read_checkpoint(path);
    params = got.params;
    m.assign(got.m.begin() + long(sh.lo), got.m.begin() + long(sh.hi));
    v.assign(got.v.begin() + long(sh.lo), got.v.begin() + long(sh.hi));
  } else if (mode == "read-slice") {
    sb::read_checkpoint_slice(path, {sh.lo, sh.hi, params, m, v}, MPI_COMM_WORLD);
  } else if (mode == "plain") {
    if (rank == 0) sb::write_checkpoint(path, ck);
  } else if (mode == "verify") {
    if (rank == 0) sb::h5::check_file(path, "a checkpoint");
  } else {
    const sb::CheckpointSlice mine{params, sh.lo, m, v};
    sb::write_checkpoint_slices(path, ck, mine, MPI_COMM_WORLD,
                                 mode == "stream" ? sb::CheckpointIo::Stream : sb::CheckpointIo::Collective);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double secs = MPI_Wtime() - t0, after = vmhwm_mib();
  double mx[2] = {before, after}, all[2] = {0, 0};
  MPI_Reduce(mx, all, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    const double gb = double(std::filesystem::file_size(path)) / 1e9;
    std::printf("%s ranks=%d params=%zu file=%.2fGB %s_s=%.1f rank0_state_MiB=%.0f rank0_peak_MiB=%.0f "
                "max_rank_state_MiB=%.0f max_rank_peak_MiB=%.0f\n",
                mode.c_str(), size, n, gb, read ? "read" : "write", secs, before, after, all[0], all[1]);
    if (mode == "verify") std::printf("verify: %.2f GB/s; one plain read of the file raw_s=%.2f (%.2f GB/s)\n", gb / secs, raw_s, gb / raw_s);
    std::filesystem::remove(path);
  }
  MPI_Finalize();
  return 0;
}
