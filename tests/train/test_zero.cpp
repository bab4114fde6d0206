// Issue 22, ZeRO-1 (train.zero = 1) in-process on 1, 2 and 4 ranks: the sliced optimizer trains
// the same model as plain data parallelism (losses, weights and the checkpoint's moments to 1e-5
// relative, with the clip active and the collectives in many rounds), and the sliced checkpoint
// writers (collective and streamed) write the file write_checkpoint writes, which h5py reads; the
// slice reader of a resume reads what read_checkpoint reads, in bounded pieces, and refuses a
// corrupt file on every rank. The reduction range by range to each slice's owner (what the CUDA
// engine overlaps with the backward, and the CPU engine's zero path): its pieces, and its sums
// against MPI_Reduce_scatter.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "io/checkpoint.hpp"
#include "io/h5.hpp"
#include "src/comm/comm.hpp"
#include "tests/restamp.hpp"
#include "src/engine/engine.hpp"
#include "src/train/trainer.hpp"
#include "train_test_util.hpp"

using namespace sbtest;
namespace fs = std::filesystem;

namespace {

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, s = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, double(std::fabs(a[i] - b[i]))), s = std::max(s, double(std::fabs(a[i])));
  return d / s;
}

// A checkpoint of random values with tensors of these shapes (flat offsets in order).
sb::Checkpoint random_checkpoint(const std::vector<std::vector<int64_t>>& shapes, int ranks, uint32_t seed) {
  sb::Checkpoint full;
  full.step = 7, full.ranks = ranks, full.config_toml = "[train]\nzero = 1\n";
  full.data_epoch = 2, full.data_cursor = 11, full.skipped_steps = 1;
  size_t n = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    size_t sz = 1;
    for (auto d : shapes[i]) sz *= size_t(d);
    full.tensors.push_back({"t" + std::to_string(i), shapes[i], n, sz});
    n += sz;
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  for (auto* b : {&full.params, &full.m, &full.v})
    for (size_t i = 0; i < n; ++i) b->push_back(g(rng));
  return full;
}

}  // namespace

TEST(Zero, SlicedOptimizerTrainsAsPlainDataParallel) {
  sb::Comm comm;
  std::string dir = scratch(comm, "zero");
  // grad_clip low enough to clip every step; bucket_mb 0.01 splits the collectives into rounds;
  // 3 micro-batches of 512 tokens a step: ranks with 2, 1 and none of them start their layers'
  // reductions to the owners in different places (the last backward, or the reduce phase).
  const std::string base = "--set train.steps=4 --set balance.self_profile=false --set train.grad_clip=0.05"
                           " --set checkpoint.every=2 --set train.bucket_mb=0.01 --set train.global_batch_tokens=1536";
  sb::Config c0 = tiny_config(dir, base + " --set checkpoint.dir=" + dir + "/c0 --set log.path=" + dir + "/m0.h5");
  sb::Config c1 = tiny_config(dir, base + " --set checkpoint.dir=" + dir + "/c1 --set log.path=" + dir +
                                       "/m1.h5 --set train.zero=1");
  sb::Trainer t0(c0, comm, "", 0);
  sb::TrainResult r0 = t0.run();
  sb::Trainer t1(c1, comm, "", 0);
  sb::TrainResult r1 = t1.run();
  ASSERT_EQ(r1.last_step, 4);
  EXPECT_NEAR(r1.first_loss, r0.first_loss, 1e-5 * r0.first_loss);
  EXPECT_NEAR(r1.last_loss, r0.last_loss, 1e-5 * r0.last_loss);
  EXPECT_LT(max_rel(t1.model().weights(), t0.model().weights()), 1e-5);
  if (comm.root()) {  // the sliced checkpoint holds the whole state, as the plain one
    for (int s : {2, 4}) {
      sb::Checkpoint a = sb::read_checkpoint(sb::checkpoint_path(dir + "/c0", s));
      sb::Checkpoint b = sb::read_checkpoint(sb::checkpoint_path(dir + "/c1", s));
      EXPECT_LT(max_rel(b.params, a.params), 1e-5) << "step " << s;
      EXPECT_LT(max_rel(b.m, a.m), 1e-5) << "step " << s;
      EXPECT_LT(max_rel(b.v, a.v), 1e-5) << "step " << s;
      EXPECT_EQ(b.ranks, comm.size());
    }
  }
}

// Tensors of rank 1, 2 and 3 that the slices cut anywhere; 3 values on 4 ranks leave a rank with
// nothing to write (it still joins every collective call).
TEST(Zero, SlicedWritersWriteTheWholeFileCheckpoint) {
  sb::Comm comm;
  std::string dir = scratch(comm, "zero_io");
  for (const std::vector<std::vector<int64_t>>& shapes :
       {std::vector<std::vector<int64_t>>{{3, 5}, {7}, {4, 2, 3}, {2, 9}}, {{3}}}) {
    const sb::Checkpoint full = random_checkpoint(shapes, comm.size(), 3);
    const size_t n = full.params.size();
    const sb::Slice sh = sb::slice_of(n, comm.rank(), comm.size());
    sb::Checkpoint meta = full;
    meta.params.clear(), meta.m.clear(), meta.v.clear();
    const sb::CheckpointSlice mine{full.params, sh.lo, std::span(full.m).subspan(sh.lo, sh.size()),
                                   std::span(full.v).subspan(sh.lo, sh.size())};
    const std::string ref = dir + "/ref.h5", streamed = dir + "/stream.h5", coll = dir + "/coll.h5";
    if (comm.root()) sb::write_checkpoint(ref, full);
    sb::write_checkpoint_slices(streamed, meta, mine, MPI_COMM_WORLD, sb::CheckpointIo::Stream);
    if (sb::kCollectiveCheckpoints)
      sb::write_checkpoint_slices(coll, meta, mine, MPI_COMM_WORLD, sb::CheckpointIo::Collective);
    comm.barrier();
    if (!comm.root()) continue;
    for (const std::string& p : {streamed, coll}) {
      if (p == coll && !sb::kCollectiveCheckpoints) continue;
      sb::Checkpoint got = sb::read_checkpoint(p);  // the checksum chained through the ranks verifies
      EXPECT_EQ(got.params, full.params) << p;
      EXPECT_EQ(got.m, full.m) << p;
      EXPECT_EQ(got.v, full.v) << p;
      EXPECT_EQ(got.step, 7);
      EXPECT_EQ(got.skipped_steps, 1);
      EXPECT_FALSE(fs::exists(p + ".tmp"));
      // h5py reads it as a plain checkpoint: every dataset and the checksum equal the reference file's.
      const std::string py = dir + "/same.py";
      std::ofstream(py) << "import h5py, numpy as np, sys\n"
                           "a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])\n"
                           "ok = all(a[g][k].shape == b[g][k].shape and np.array_equal(a[g][k][()], b[g][k][()])\n"
                           "         for g in ['params', 'optim/m', 'optim/v'] for k in b[g])\n"
                           "print('h5py', 'same' if ok and a.attrs['checksum'] == b.attrs['checksum'] else 'DIFFERENT')\n";
      const sbtest::Run r = sbtest::run_clean("/usr/bin/python3 " + py + " " + p + " " + ref);
      EXPECT_EQ(r.out, "h5py same\n") << p;
    }
  }
}

// The slice reader (read_checkpoint_slice, what a resume uses) on groups of 1, 2 and all ranks of
// a checkpoint written by every rank: each rank's slice (train.zero = 1), and every rank the
// whole (zero = 0), bit for bit as read_checkpoint's, with each read call bounded by a tiny
// piece; then a byte flipped in /optim/m is refused on every rank of the group.
TEST(Zero, SliceReaderReadsWhatTheWholeReaderReads) {
  sb::Comm comm;
  std::string dir = scratch(comm, "zero_slice");
  const sb::Checkpoint full = random_checkpoint({{3, 5}, {7}, {4, 2, 3}, {2, 9}}, comm.size(), 5);
  const size_t n = full.params.size();
  const sb::Slice sh = sb::slice_of(n, comm.rank(), comm.size());
  sb::Checkpoint meta = full;
  meta.params.clear(), meta.m.clear(), meta.v.clear();
  const std::string path = dir + "/ck.h5";
  sb::write_checkpoint_slices(path, meta, {full.params, sh.lo, std::span(full.m).subspan(sh.lo, sh.size()),
                                            std::span(full.v).subspan(sh.lo, sh.size())},
                               MPI_COMM_WORLD, sb::CheckpointIo::Stream);
  const sb::Checkpoint want = sb::read_checkpoint(path);
  for (int ranks : {comm.size(), 2, 1}) {
    if (ranks > comm.size()) continue;
    MPI_Comm group;
    MPI_Comm_split(MPI_COMM_WORLD, comm.rank() < ranks ? 0 : MPI_UNDEFINED, comm.rank(), &group);
    if (group != MPI_COMM_NULL) {
      for (bool sliced : {true, false}) {
        const sb::Slice s = sliced ? sb::slice_of(n, comm.rank(), ranks) : sb::Slice{0, n};
        std::vector<float> w(n), m(s.size()), v(sliced ? 0 : s.size());  // v: into the Checkpoint
        size_t largest = 0;
        const sb::Checkpoint got =
            sb::read_checkpoint_slice(path, {s.lo, s.hi, w, m, v, 4, &largest}, group);
        const auto part = [&](const std::vector<float>& x) {
          return std::vector<float>(x.begin() + long(s.lo), x.begin() + long(s.hi));
        };
        EXPECT_EQ(w, want.params) << ranks << " ranks";
        EXPECT_EQ(m, part(want.m)) << ranks << " ranks";
        EXPECT_EQ(sliced ? got.v : v, part(want.v)) << ranks << " ranks";
        EXPECT_TRUE(got.params.empty() && got.m.empty());  // read in place
        EXPECT_EQ(got.step, 7);
        EXPECT_EQ(got.data_cursor, 11);
        EXPECT_EQ(got.tensors.size(), want.tensors.size());
        EXPECT_LE(largest, 4u);
        EXPECT_GT(largest, 0u);
      }
      MPI_Comm_free(&group);
    }
    comm.barrier();
  }
  // One byte of /optim/m/t2 flipped: refused on every rank of a group of 2 (or 1).
  if (comm.root()) {
    haddr_t at = 0;
    {
      sb::h5::Id f = sb::h5::open_read(path);
      sb::h5::Id ds(H5Dopen2(f, "optim/m/t2", H5P_DEFAULT));
      at = H5Dget_offset(ds);
    }
    {
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(long(at) + 5);
      char c = 0;
      io.read(&c, 1);
      c ^= 0x10;
      io.seekp(long(at) + 5);
      io.write(&c, 1);
    }
    sbtest::restamp(path);  // past the whole-file checksum: this test is about the slices' chained one
  }
  comm.barrier();
  const int ranks = std::min(comm.size(), 2);
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, comm.rank() < ranks ? 0 : MPI_UNDEFINED, comm.rank(), &group);
  if (group != MPI_COMM_NULL) {
    const sb::Slice s = sb::slice_of(n, comm.rank(), ranks);
    std::string msg;
    try {
      sb::read_checkpoint_slice(path, {s.lo, s.hi, {}, {}, {}, 4, nullptr}, group);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(path + ": checksum mismatch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the checkpoint is corrupt"), std::string::npos) << msg;
    MPI_Comm_free(&group);
  }
  comm.barrier();
}

// owner_pieces over random tilings of [0, n): every piece non-empty, at most the bucket, inside its
// range and its owner's slice, in rank order within a range; together they cover [0, n) once, each
// value with its slice's owner. reduction_ranges of a model layout tiles the buffer, layers last first.
TEST(Zero, OwnerPiecesCoverEachSliceOnceInBoundedPieces) {
  std::mt19937 rng(11);
  for (size_t n : {0, 1, 3, 7, 100, 1001})
    for (int ranks : {1, 2, 3, 4, 7})
      for (size_t bucket : {1, 5, 64, 5000}) {
        std::vector<size_t> cuts{0, n};
        for (int i = 0; i < 4 && n > 1; ++i) cuts.push_back(rng() % n);
        std::sort(cuts.begin(), cuts.end());
        std::vector<int> owner(n, -1);
        for (size_t c = 0; c + 1 < cuts.size(); ++c) {
          const sb::Slice range{cuts[c], cuts[c + 1]};
          int last = -1;
          for (const sb::OwnerPiece& p : sb::owner_pieces(n, range, bucket, ranks)) {
            const sb::Slice sh = sb::slice_of(n, p.owner, ranks);
            ASSERT_GT(p.s.size(), 0u);
            ASSERT_LE(p.s.size(), bucket);
            ASSERT_TRUE(p.s.lo >= range.lo && p.s.hi <= range.hi && p.s.lo >= sh.lo && p.s.hi <= sh.hi)
                << "n " << n << " ranks " << ranks << " piece [" << p.s.lo << ", " << p.s.hi << ")";
            ASSERT_GE(p.owner, last);
            last = p.owner;
            for (size_t i = p.s.lo; i < p.s.hi; ++i) {
              ASSERT_EQ(owner[i], -1) << "value " << i << " twice";
              owner[i] = p.owner;
            }
          }
        }
        for (int r = 0; r < ranks; ++r)
          for (size_t i = sb::slice_of(n, r, ranks).lo; i < sb::slice_of(n, r, ranks).hi; ++i)
            ASSERT_EQ(owner[i], r) << "n " << n << " ranks " << ranks << " value " << i;
      }
  // LayerReduction: some layers started by the backward, the rest in the reduce phase, start the
  // same ranges in the same order as the reduce phase alone; the next step starts afresh.
  sb::ModelDims d;
  d.n_layers = 3, d.tied = false, d.qkv_bias = true;
  {
    const sb::ParamLayout lay(d);
    std::vector<size_t> seen;
    sb::LayerReduction red(lay, lay.size, [&](sb::Slice r) { seen.push_back(r.lo); });
    ASSERT_TRUE(red.on());
    red.rest();
    const std::vector<size_t> alone = seen;
    ASSERT_EQ(alone.size(), sb::reduction_ranges(lay, lay.size).size());
    for (int step = 0; step < 2; ++step) {
      seen.clear();
      red.layer_done(2), red.layer_done(1), red.layer_done(1);
      red.rest();
      EXPECT_EQ(seen, alone) << "step " << step;
    }
  }
  const sb::ParamLayout layout(d);
  const std::vector<sb::Slice> rs = sb::reduction_ranges(layout, layout.size);
  ASSERT_GE(rs.size(), 4u);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(rs[size_t(2 - l)].lo, layout.layer_range(l).first);
  std::vector<sb::Slice> sorted = rs;
  std::sort(sorted.begin(), sorted.end(), [](sb::Slice a, sb::Slice b) { return a.lo < b.lo; });
  EXPECT_EQ(sorted.front().lo, 0u);
  EXPECT_EQ(sorted.back().hi, layout.size);
  for (size_t i = 0; i + 1 < sorted.size(); ++i) EXPECT_EQ(sorted[i].hi, sorted[i + 1].lo);
}

// Real ranks: random integers (exact sums in fp32) reduced range by range to their owners, in
// pieces of 7 values, give this rank's slice exactly as MPI_Reduce_scatter of the same data, and
// leave the rest of the buffer as it was; n = 3 leaves ranks without a slice at 4 ranks.
TEST(Zero, OwnerReductionSumsAsReduceScatter) {
  sb::Comm comm;
  const int R = comm.size(), me = comm.rank();
  for (size_t n : {size_t(3), size_t(1037)}) {
    std::mt19937 rng(uint32_t(100 + me));
    std::uniform_int_distribution<int> val(-1000, 1000);
    std::vector<float> g(n);
    for (float& x : g) x = float(val(rng));
    const std::vector<float> orig = g;
    std::vector<int> counts(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) counts[size_t(r)] = int(sb::slice_of(n, r, R).size());
    const sb::Slice my = sb::slice_of(n, me, R);
    std::vector<float> want(my.size() + 1);
    ASSERT_EQ(MPI_Reduce_scatter(orig.data(), want.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
              MPI_SUCCESS);
    want.resize(my.size());
    // The same tiling on every rank, not aligned with the slices; reduced last range first.
    std::vector<sb::Slice> ranges;
    for (size_t lo = 0; lo < n; lo += 101) ranges.push_back({lo, std::min(n, lo + 101)});
    std::reverse(ranges.begin(), ranges.end());
    sb::MpiGradReducer red(comm, 7 * sizeof(float));
    for (const sb::Slice& r : ranges) red.reduce_to_owners(g.data(), n, r);
    EXPECT_EQ(std::vector<float>(g.begin() + long(my.lo), g.begin() + long(my.hi)), want) << "n " << n;
    for (size_t i = 0; i < n; ++i) {
      if (i >= my.lo && i < my.hi) continue;
      ASSERT_EQ(g[i], orig[i]) << "n " << n << " value " << i << " outside the slice";
    }
  }
}
