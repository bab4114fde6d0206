// The K/V exchange of a split document (attention.part_exchange): bytes received and seconds,
// all-gather against selective, on G = world MPI ranks, for one document of --len tokens split
// over the world, dense and sparse (budget chosen for the --density given), random Q and K (--shared:
// with a common query direction, below). Only the exchange runs
// (the calls src/model/part_attention.cpp makes, in its order), not the attention around it; and
// each member's sparse gating, of the whole document's rows (as before) against its own rows only.
//   mpirun -np 4 ./build/bench/bench_cp_exchange --len 32768 --density 0.1 [--shared 4] [--reps 5]
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/cpp/bench_flags.hpp"
#include "src/comm/comm.hpp"
#include "src/model/part_attention.hpp"
#include "src/parts/groups.hpp"

namespace {

namespace k = sb::kernels;

struct Result {
  double fwd_bytes = 0, fwd_s = 0, bwd_bytes = 0, bwd_s = 0;
};

// Max over ranks of the seconds, sum of the bytes.
Result reduce(const Result& r) {
  double s[2] = {r.fwd_s, r.bwd_s}, b[2] = {r.fwd_bytes, r.bwd_bytes};
  MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, b, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return {b[0], s[0], b[1], s[1]};
}

}  // namespace

int main(int argc, char** argv) {
  sb::MpiSession mpi(&argc, &argv);
  int len = 32768, reps = 5;
  double density = 0.1, shared = 0;
  for (sb::bench::Flags f("bench_cp_exchange", argc, argv); f.next();) {
    if (f.is("--len")) len = int(f.integer(1, INT_MAX));
    else if (f.is("--density")) density = f.number(0, 1, true);
    else if (f.is("--reps")) reps = int(f.integer(1, INT_MAX));
    else if (f.is("--shared")) shared = f.number(0, HUGE_VAL, false);
    else f.unknown();
  }
  sb::Comm comm;
  const int G = comm.size();
  // A tiny model's attention: 4 query heads, 2 kv heads of 16, blocks of 64.
  const k::AttnShape s{4, 2, 16, 64};
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim, bs = s.block_size;
  const int nb = (len + bs - 1) / bs;
  std::mt19937 rng(7);  // the same document on every rank
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> Q(size_t(len) * HD), K(size_t(len) * KD);
  // --shared c: every query leans on one direction u (c * u added), so the same key blocks (those
  // whose pooled keys point along u: heavy hitters) score highest for every row; 0: iid rows.
  std::vector<float> u(size_t(s.head_dim));
  for (auto& x : u) x = nd(rng);
  for (size_t i = 0; i < Q.size(); ++i) Q[i] = nd(rng) + float(shared) * u[i % u.size()];
  for (auto& x : K) x = nd(rng);
  if (comm.root())
    std::printf("len %d, %d ranks, blocks of %d, Hkv*D %d, float32, shared query direction %.1f\n", len, G, bs, KD,
                shared);
  for (bool sparse : {false, true}) {
    // Budget k for the density asked: a row keeps k + w + 2 of its (nb + 1) / 2 causal blocks on average.
    const int kk = std::max(0, int(density * (nb + 1) / 2.0) - 3);
    const k::GatingParams p{kk, 1, 1e9};
    const auto costs = sb::block_costs(len, bs, sparse, kk, 1, 0.1);
    sb::PartGroups groups(comm);
    sb::DocPart sh = groups.add(0, len, sb::split_document(len, G, bs, costs)).value();
    const int32_t cu[2] = {0, len};
    k::BlockSelection sel;
    const k::GatingStats whole = sparse ? k::gate_blocks(Q.data(), K.data(), cu, 1, s, p, sel)
                                        : k::select_all_causal(cu, 1, s, sel);
    sb::keep_own_rows(sh, s, sel);
    if (sparse) {  // each member's gating: every row of the document, then its own kept (before), or its own rows only
      std::vector<char> own(size_t(nb), 0);
      for (auto [b, e] : sh.pieces)
        for (int i = b / bs; i * bs < e; ++i) own[size_t(i)] = 1;
      std::vector<double> kbar(size_t(nb) * KD);
      double t[2] = {1e300, 1e300};
      for (int r = 0; r < reps; ++r) {
        k::BlockSelection a, b;
        comm.barrier();
        double t0 = MPI_Wtime();
        k::gate_blocks(Q.data(), K.data(), cu, 1, s, p, a);
        sb::keep_own_rows(sh, s, a);
        t[0] = std::min(t[0], MPI_Wtime() - t0);
        comm.barrier();
        t0 = MPI_Wtime();
        k::pool_block_keys(K.data(), len, 0, nb, s, p, kbar.data());
        k::gate_blocks_pooled(Q.data(), kbar.data(), len, s, p, b, own.data());
        t[1] = std::min(t[1], MPI_Wtime() - t0);
        if (a.cols != b.cols) std::fprintf(stderr, "bench_cp_exchange: own-row gating differs from the whole's rows\n");
      }
      MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (comm.root())
        std::printf("sparse gating per member (slowest): whole document's rows %8.2f ms, own rows %8.2f ms\n", t[0] * 1e3,
                    t[1] * 1e3);
    }
    const size_t n = size_t(sh.local_tokens());
    std::vector<float> mine(n * KD, 1.f), kv(n * 2 * KD, 1.f), doc(size_t(len) * KD);
    std::vector<double> pooled_mine, pooled(size_t(nb) * KD);
    for (auto [b, e] : sh.pieces) pooled_mine.resize(pooled_mine.size() + size_t((e + bs - 1) / bs - b / bs) * KD);
    const sb::PartNeeds nd0 = groups.exchange_f32().share_needs(sh, sb::needed_ranges(sh, sel, bs));
    const double share = double(nd0.selective_rows) / double(nd0.allgather_rows);  // what auto compares
    for (auto mode : {sb::PartExchangeMode::AllGather, sb::PartExchangeMode::Selective}) {
      const sb::PartExchange<float>& ex = groups.exchange_f32();
      Result best;
      for (int r = 0; r < reps; ++r) {
        Result one;
        comm.barrier();
        groups.reset_traffic();
        const double t0 = MPI_Wtime();
        sb::PartNeeds needs;
        if (mode == sb::PartExchangeMode::AllGather) {  // forward: K and V
          ex.gather(sh, mine, doc, KD), ex.gather(sh, mine, doc, KD);
        } else {  // forward: pooled keys (sparse), needs, K|V of the needed blocks
          if (sparse) ex.gather_blocks(sh, pooled_mine, pooled, KD, bs);
          needs = ex.share_needs(sh, sb::needed_ranges(sh, sel, bs));
          std::vector<float> got(size_t(needs.rows(needs.member)) * 2 * KD);
          ex.fetch(sh, needs, kv, got, 2 * KD);
        }
        one.fwd_s = MPI_Wtime() - t0, one.fwd_bytes = groups.traffic().bytes;
        comm.barrier();
        groups.reset_traffic();
        const double t1 = MPI_Wtime();
        if (mode == sb::PartExchangeMode::AllGather) {  // backward: K and V again, dK and dV back
          ex.gather(sh, mine, doc, KD), ex.gather(sh, mine, doc, KD);
          ex.reduce_scatter(sh, doc, mine, KD), ex.reduce_scatter(sh, doc, mine, KD);
        } else {
          needs = ex.share_needs(sh, sb::needed_ranges(sh, sel, bs));
          std::vector<float> got(size_t(needs.rows(needs.member)) * 2 * KD);
          ex.fetch(sh, needs, kv, got, 2 * KD);
          ex.give_back(sh, needs, got, kv, 2 * KD);
        }
        one.bwd_s = MPI_Wtime() - t1, one.bwd_bytes = groups.traffic().bytes;
        one = reduce(one);
        if (r == 0 || one.fwd_s + one.bwd_s < best.fwd_s + best.bwd_s) best = one;
      }
      if (comm.root()) {
        std::printf("%-6s density %.3f  %-9s  fwd %8.2f MiB %8.2f ms   bwd %8.2f MiB %8.2f ms",
                    sparse ? "sparse" : "dense", whole.density(),
                    mode == sb::PartExchangeMode::AllGather ? "allgather" : "selective", best.fwd_bytes / 1048576,
                    best.fwd_s * 1e3, best.bwd_bytes / 1048576, best.bwd_s * 1e3);
        if (mode == sb::PartExchangeMode::Selective) std::printf("   rows %.3f of the all-gather's", share);
        std::printf("\n");
      }
    }
  }
  return 0;
}
