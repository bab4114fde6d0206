#include "src/comm/row_exchange.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "base/bf16.hpp"
#include "base/error.hpp"
#include "src/comm/comm.hpp"
#include "src/comm/mpi_check.hpp"

namespace sb {

namespace {

// The pieces of every member tile [0, doc_len): every row has one owner (a bug upstairs otherwise).
void check_tiling(const std::vector<RowRanges>& pieces, int me, int32_t doc_len) {
  if (me < 0 || me >= int(pieces.size()))
    throw Error("row exchange: member " + std::to_string(me) + " of a group of " + std::to_string(pieces.size()));
  RowRanges all;
  for (const RowRanges& ps : pieces) all.insert(all.end(), ps.begin(), ps.end());
  std::sort(all.begin(), all.end());
  int32_t at = 0;
  for (auto [b, e] : all) {
    if (b != at || e < b)
      throw Error("row exchange: the members' pieces do not tile the document of " + std::to_string(doc_len) +
                  " tokens (a piece [" + std::to_string(b) + ", " + std::to_string(e) + ") after token " +
                  std::to_string(at) + ")");
    at = e;
  }
  if (at != doc_len)
    throw Error("row exchange: the members' pieces cover " + std::to_string(at) + " of " + std::to_string(doc_len) +
                " tokens");
}

size_t tokens(const RowRanges& ps) {
  size_t n = 0;
  for (auto [b, e] : ps) n += size_t(e - b);
  return n;
}

}  // namespace

RowPlan gather_plan(const std::vector<RowRanges>& pieces, int me, int32_t doc_len) {
  check_tiling(pieces, me, doc_len);
  RowPlan p;
  p.members = int(pieces.size());
  p.in_rows = tokens(pieces[size_t(me)]), p.out_rows = size_t(doc_len);
  for (int m = 0; m < p.members; ++m) {
    size_t at = 0;  // member m's packed row
    for (auto [b, e] : pieces[size_t(m)]) {
      const size_t n = size_t(e - b);
      if (n == 0) continue;
      if (m == me) {
        p.local.push_back({me, at, size_t(b), n});
        for (int o = 0; o < p.members; ++o)
          if (o != me) p.send.push_back({o, at, size_t(b), n});
      } else {
        p.recv.push_back({m, at, size_t(b), n});
      }
      at += n;
    }
  }
  // Sends grouped by peer, each peer's runs in piece order (the order its receives list them).
  std::stable_sort(p.send.begin(), p.send.end(), [](const RowMove& x, const RowMove& y) { return x.peer < y.peer; });
  return p;
}

RowPlan scatter_plan(const std::vector<RowRanges>& pieces, int me, int32_t doc_len) {
  check_tiling(pieces, me, doc_len);
  RowPlan p;
  p.members = int(pieces.size());
  const size_t T = tokens(pieces[size_t(me)]);
  p.in_rows = size_t(doc_len), p.out_rows = size_t(p.members) * T;
  for (int o = 0; o < p.members; ++o) {
    const size_t To = tokens(pieces[size_t(o)]);
    size_t at = 0;  // member o's packed row
    for (auto [b, e] : pieces[size_t(o)]) {
      const size_t n = size_t(e - b);
      if (n == 0) continue;
      if (o == me) {
        p.local.push_back({me, size_t(b), size_t(me) * T + at, n});
        for (int m = 0; m < p.members; ++m)  // member m's contribution lands in block m of my stage
          if (m != me) p.recv.push_back({m, size_t(b), size_t(m) * T + at, n});
      } else {
        p.send.push_back({o, size_t(b), size_t(me) * To + at, n});
      }
      at += n;
    }
  }
  std::stable_sort(p.recv.begin(), p.recv.end(), [](const RowMove& x, const RowMove& y) { return x.peer < y.peer; });
  return p;
}

size_t run_plan(const RowPlan& plan, RowTransport& t, const void* from, void* to, size_t row_bytes) {
  const auto* src = static_cast<const unsigned char*>(from);
  auto* dst = static_cast<unsigned char*>(to);
  size_t got = 0;
  t.begin();
  for (const RowMove& m : plan.send) t.send(src + m.src * row_bytes, m.rows * row_bytes, m.peer);
  for (const RowMove& m : plan.recv) t.recv(dst + m.dst * row_bytes, m.rows * row_bytes, m.peer), got += m.rows;
  for (const RowMove& m : plan.local) t.copy(dst + m.dst * row_bytes, src + m.src * row_bytes, m.rows * row_bytes);
  t.end();
  return got * row_bytes;
}

MpiRowTransport::MpiRowTransport(const Group& g) : comm_(g.mpi()) {}

// Messages above INT_MAX bytes go as several, in order (both sides cut them the same way).
constexpr size_t kMpiChunk = size_t(INT_MAX / 2);

void MpiRowTransport::send(const void* p, size_t bytes, int peer) {
  for (size_t off = 0; off < bytes; off += kMpiChunk) {
    reqs_.emplace_back();
    MPI_CHECK(MPI_Isend(static_cast<const unsigned char*>(p) + off, int(std::min(kMpiChunk, bytes - off)), MPI_BYTE,
                        peer, 21, comm_, &reqs_.back()));
  }
}

void MpiRowTransport::recv(void* p, size_t bytes, int peer) {
  for (size_t off = 0; off < bytes; off += kMpiChunk) {
    reqs_.emplace_back();
    MPI_CHECK(MPI_Irecv(static_cast<unsigned char*>(p) + off, int(std::min(kMpiChunk, bytes - off)), MPI_BYTE, peer,
                        21, comm_, &reqs_.back()));
  }
}

void MpiRowTransport::copy(void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); }

void MpiRowTransport::end() {
  if (!reqs_.empty()) MPI_CHECK(MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE));
  reqs_.clear();
}

void sum_blocks_bf16(const uint16_t* stage, int members, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    float s = 0;
    for (int m = 0; m < members; ++m) s += bf16_to_f32(stage[size_t(m) * n + i]);
    out[i] = f32_to_bf16(s);
  }
}

}  // namespace sb
