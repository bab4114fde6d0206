#include "src/comm/comm.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "base/error.hpp"
#include "src/comm/mpi_check.hpp"

namespace sb {

MpiSession::MpiSession(int* argc, char*** argv) {
  int inited = 0;
  MPI_CHECK(MPI_Initialized(&inited));
  if (!inited) {
    setenv("OMPI_MCA_fcoll", "dynamic_gen2", /*overwrite=*/0);  // not vulcan (comm.hpp); other MPIs ignore it
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    owner_ = true;
    // Errors come back as codes so MPI_CHECK can name the call instead of MPI aborting silently.
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  }
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owner_ && !finalized) MPI_Finalize();
}

Comm::Comm() {
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &local_size_));
  MPI_CHECK(MPI_Comm_free(&local));
}

void Comm::barrier() const { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

double Comm::allreduce_max(double x) const {
  double out = 0;
  MPI_CHECK(MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return out;
}

void Comm::allreduce_sum_inplace(std::span<double> x) const {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x.data(), int(x.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
}

void Comm::allgather(std::span<const double> mine, std::span<double> all) const {
  if (all.size() != mine.size() * size_t(size_))
    throw Error("Comm::allgather: " + std::to_string(all.size()) + " values to receive, expected " +
                std::to_string(mine.size()) + " x " + std::to_string(size_) + " ranks");
  MPI_CHECK(MPI_Allgather(mine.data(), int(mine.size()), MPI_DOUBLE, all.data(), int(mine.size()),
                          MPI_DOUBLE, MPI_COMM_WORLD));
}

bool Comm::all_equal(uint64_t x) const {
  uint64_t lo = 0, hi = 0;
  MPI_CHECK(MPI_Allreduce(&x, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(&x, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
  return lo == hi;
}

void Comm::broadcast(std::string& s, int root) const {
  int64_t n = int64_t(s.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD));
  s.resize(size_t(n));
  broadcast(std::span<unsigned char>(reinterpret_cast<unsigned char*>(s.data()), s.size()), root);
}

void Comm::broadcast(std::span<unsigned char> bytes, int root) const {
  for (size_t off = 0; off < bytes.size(); off += INT_MAX / 2) {
    int n = int(std::min<size_t>(INT_MAX / 2, bytes.size() - off));
    MPI_CHECK(MPI_Bcast(bytes.data() + off, n, MPI_BYTE, root, MPI_COMM_WORLD));
  }
}

Group::Group(const Comm&, int color, int key) {
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &comm_));
  if (comm_ == MPI_COMM_NULL) return;
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

Group::~Group() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Group::Group(Group&& o) noexcept : comm_(o.comm_), rank_(o.rank_), size_(o.size_) { o.comm_ = MPI_COMM_NULL; }

// Counts and their displacements, checked against the buffers (a mismatch is a bug upstairs).
static std::vector<int> displacements(std::span<const int> counts, int size, size_t whole, size_t part, int rank,
                                      const char* what) {
  std::vector<int> displ(size_t(size) + 1, 0);
  if (int(counts.size()) != size) throw Error(std::string(what) + ": one count per group member expected");
  for (int r = 0; r < size; ++r) displ[size_t(r) + 1] = displ[size_t(r)] + counts[size_t(r)];
  if (size_t(displ.back()) != whole || size_t(counts[size_t(rank)]) != part)
    throw Error(std::string(what) + ": buffer sizes differ from the counts (" + std::to_string(whole) + " vs " +
                std::to_string(displ.back()) + ", " + std::to_string(part) + " vs " +
                std::to_string(counts[size_t(rank)]) + ")");
  return displ;
}

template <class T>
void Group::gatherv(std::span<const T> mine, std::span<T> all, std::span<const int> counts, MPI_Datatype t) const {
  std::vector<int> displ = displacements(counts, size_, all.size(), mine.size(), rank_, "Group::allgatherv");
  MPI_CHECK(MPI_Allgatherv(mine.data(), int(mine.size()), t, all.data(), counts.data(), displ.data(), t, comm_));
}

void Group::allgatherv(std::span<const int32_t> mine, std::span<int32_t> all, std::span<const int> counts) const {
  gatherv(mine, all, counts, MPI_INT32_T);
}

std::vector<int> Group::allgather(int x) const {
  std::vector<int> all(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Allgather(&x, 1, MPI_INT, all.data(), 1, MPI_INT, comm_));
  return all;
}

template <class T>
void Group::a2av(std::span<const T> send, std::span<const int> sc, std::span<T> recv, std::span<const int> rc,
                 MPI_Datatype t) const {
  const std::vector<int> sd = displacements(sc, size_, send.size(), size_t(rank_ < int(sc.size()) ? sc[size_t(rank_)] : 0), rank_,
                                            "Group::alltoallv (send)");
  const std::vector<int> rd = displacements(rc, size_, recv.size(), size_t(rank_ < int(rc.size()) ? rc[size_t(rank_)] : 0), rank_,
                                            "Group::alltoallv (recv)");
  MPI_CHECK(MPI_Alltoallv(send.data(), sc.data(), sd.data(), t, recv.data(), rc.data(), rd.data(), t, comm_));
}

void Group::alltoallv(std::span<const float> send, std::span<const int> sc, std::span<float> recv,
                      std::span<const int> rc) const {
  a2av(send, sc, recv, rc, MPI_FLOAT);
}
void Group::alltoallv(std::span<const double> send, std::span<const int> sc, std::span<double> recv,
                      std::span<const int> rc) const {
  a2av(send, sc, recv, rc, MPI_DOUBLE);
}

void MpiGradReducer::allreduce_sum(float* data, size_t n) {
  if (comm_.size() == 1) return;
  // Buckets bound the size of one message (and, on GPUs, let reduction overlap the backward).
  size_t b = std::max<size_t>(bucket_, 1);
  for (size_t off = 0; off < n; off += b) {
    int cnt = int(std::min(b, n - off));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  }
}


Slice slice_of(size_t n, int rank, int ranks) {
  const size_t r = size_t(rank), q = n / size_t(ranks), extra = n % size_t(ranks);
  const size_t lo = r * q + std::min(r, extra);
  return {lo, lo + q + (r < extra ? 1 : 0)};
}

ZeroRounds::ZeroRounds(size_t n_, size_t bucket, int ranks_) : n(n_), ranks(ranks_) {
  w = std::max<size_t>(1, std::min<size_t>(bucket / size_t(ranks), INT_MAX / size_t(ranks)));
  rounds = (slice_of(n, 0, ranks).size() + w - 1) / w;  // rank 0 holds the largest slice
}

Slice ZeroRounds::piece(int r, size_t c) const {
  const Slice s = slice_of(n, r, ranks);
  const size_t a = std::min(s.hi, s.lo + c * w);
  return {a, std::min(s.hi, a + w)};
}

std::vector<OwnerPiece> owner_pieces(size_t n, Slice range, size_t bucket, int ranks) {
  const size_t b = std::max<size_t>(1, std::min<size_t>(bucket, INT_MAX));
  std::vector<OwnerPiece> out;
  for (int r = 0; r < ranks; ++r) {
    const Slice s = slice_of(n, r, ranks);
    const size_t lo = std::max(s.lo, range.lo), hi = std::min(s.hi, range.hi);
    for (size_t a = lo; a < hi; a += b) out.push_back({r, {a, std::min(hi, a + b)}});
  }
  return out;
}

void MpiGradReducer::reduce_to_owners(float* full, size_t n, Slice range) {
  const int me = comm_.rank();
  if (comm_.size() == 1) return;
  for (const OwnerPiece& p : owner_pieces(n, range, bucket_, comm_.size())) {
    float* at = full + p.s.lo;
    const int cnt = int(p.s.size());
    if (p.owner == me) MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, at, cnt, MPI_FLOAT, MPI_SUM, p.owner, MPI_COMM_WORLD));
    else MPI_CHECK(MPI_Reduce(at, nullptr, cnt, MPI_FLOAT, MPI_SUM, p.owner, MPI_COMM_WORLD));
  }
}

void MpiGradReducer::reduce_scatter_sum(const float* full, size_t n, float* mine) {
  const int R = comm_.size(), me = comm_.rank();
  const Slice my = slice_of(n, me, R);
  if (R == 1) {
    std::copy(full, full + n, mine);
    return;
  }
  const ZeroRounds rd(n, bucket_, R);
  std::vector<int> counts(static_cast<size_t>(R));
  for (size_t c = 0; c < rd.rounds; ++c) {
    pack_.clear();
    for (int r = 0; r < R; ++r) {
      const Slice p = rd.piece(r, c);
      pack_.insert(pack_.end(), full + p.lo, full + p.hi);
      counts[size_t(r)] = int(p.size());
    }
    const Slice mp = rd.piece(me, c);
    MPI_CHECK(MPI_Reduce_scatter(pack_.data(), mine + (mp.lo - my.lo), counts.data(), MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD));
  }
}

void MpiGradReducer::allgather(float* full, size_t n) {
  const int R = comm_.size(), me = comm_.rank();
  if (R == 1) return;
  const ZeroRounds rd(n, bucket_, R);
  std::vector<int> counts(static_cast<size_t>(R)), displs(static_cast<size_t>(R));
  for (size_t c = 0; c < rd.rounds; ++c) {
    int at = 0;
    for (int r = 0; r < R; ++r) {
      counts[size_t(r)] = int(rd.piece(r, c).size());
      displs[size_t(r)] = at;
      at += counts[size_t(r)];
    }
    pack_.resize(size_t(at));
    const Slice mp = rd.piece(me, c);
    MPI_CHECK(MPI_Allgatherv(full + mp.lo, int(mp.size()), MPI_FLOAT, pack_.data(), counts.data(), displs.data(),
                             MPI_FLOAT, MPI_COMM_WORLD));
    for (int r = 0; r < R; ++r) {
      const Slice p = rd.piece(r, c);
      std::copy(pack_.begin() + displs[size_t(r)], pack_.begin() + displs[size_t(r)] + counts[size_t(r)], full + p.lo);
    }
  }
}

}  // namespace sb
