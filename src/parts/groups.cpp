#include "src/parts/groups.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "base/error.hpp"
#include "src/comm/row_exchange.hpp"

namespace sb {

double token_cost(const ModelDims& d, int block_size) {
  const double C = d.d_model, HD = double(d.n_heads) * d.head_dim, KD = double(d.n_kv_heads) * d.head_dim;
  const double linear = 2 * (C * HD + 2 * C * KD + HD * C + 3 * C * d.ffn_dim);  // per token and layer
  return linear / (4.0 * block_size * block_size * HD);                           // QK^T and PV of one block pair
}

std::optional<DocPart> PartGroups::add(int first, int32_t doc_len, std::vector<std::vector<Piece>> pieces) {
  const int me = world_.rank(), G = int(pieces.size());
  if (first < 0 || first + G > world_.size())
    throw Error("a document split over ranks [" + std::to_string(first) + ", " + std::to_string(first + G) +
                ") needs " + std::to_string(first + G) + " ranks; the run has " + std::to_string(world_.size()));
  const bool member = me >= first && me < first + G;
  auto e = std::make_unique<Entry>(Entry{Group(world_, member ? first : -1, me), std::move(pieces), doc_len, first});
  DocPart sh;
  sh.group = int(groups_.size());
  sh.doc_len = doc_len;
  if (member) sh.pieces = e->pieces[size_t(me - first)];
  groups_.push_back(std::move(e));
  if (!member) return std::nullopt;
  return sh;
}

PartGroups::View PartGroups::view(int g) const {
  const Entry& e = *groups_.at(size_t(g));
  return {e.comm, e.pieces, e.first, e.doc_len};
}

namespace {

// Adds the seconds of its scope and `bytes` to a Traffic.
struct Timed {
  PartGroups::Traffic& t;
  double bytes;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~Timed() {
    t.bytes += bytes;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// A needed range cut at the owners' pieces: tokens [b, e) that member `owner` holds.
struct OwnedRange {
  int owner;
  int32_t b, e;
};

// Member m's needs, cut at the owners' pieces, in need (document) order.
std::vector<OwnedRange> segments(const std::vector<std::vector<Piece>>& pieces, const std::vector<Piece>& need) {
  std::vector<OwnedRange> out;
  for (auto [nb, ne] : need)
    for (int o = 0; o < int(pieces.size()); ++o)
      for (auto [pb, pe] : pieces[size_t(o)])
        if (std::max(nb, pb) < std::min(ne, pe)) out.push_back({o, std::max(nb, pb), std::min(ne, pe)});
  std::sort(out.begin(), out.end(), [](const OwnedRange& x, const OwnedRange& y) { return x.b < y.b; });
  return out;
}

// The packed row of token t among `mine` (its pieces back to back).
size_t local_row(const std::vector<Piece>& mine, int32_t t) {
  size_t at = 0;
  for (auto [b, e] : mine) {
    if (t >= b && t < e) return at + size_t(t - b);
    at += size_t(e - b);
  }
  throw Error("part exchange: token " + std::to_string(t) + " is not this member's");
}

// Every member's rows of its `pieces` (units of rows: tokens or blocks; mine: this member's, packed)
// -> whole, in document order: the device exchange's plan (src/comm/row_exchange.hpp) on MPI.
template <class T>
void allgather_pieces(const Group& g, const std::vector<std::vector<Piece>>& pieces, std::span<const T> mine,
                      std::span<T> whole, int width, PartGroups::Traffic& traffic) {
  const RowPlan p = gather_plan(pieces, g.rank(), int32_t(whole.size() / size_t(width)));
  if (p.in_rows * size_t(width) != mine.size() || p.out_rows * size_t(width) != whole.size())
    throw Error("part exchange: gather buffers of " + std::to_string(mine.size()) + " and " +
                std::to_string(whole.size()) + " values do not match the pieces");
  Timed tm{traffic, double((whole.size() - mine.size()) * sizeof(T))};
  MpiRowTransport t(g);
  run_plan(p, t, mine.data(), whole.data(), size_t(width) * sizeof(T));
}

}  // namespace

template <class T>
void PartGroups::gather(const DocPart& sh, std::span<const T> mine, std::span<T> whole, int width) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  allgather_pieces(e.comm, e.pieces, mine, whole, width, traffic_);
}

// Every member's contribution to this rank's rows (scatter_plan: G blocks, member order), summed in
// member order: the order the device exchange sums in, the same on every run.
template <class T>
void PartGroups::reduce_scatter(const DocPart& sh, std::span<const T> whole, std::span<T> mine, int width) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  const RowPlan p = scatter_plan(e.pieces, e.comm.rank(), e.doc_len);
  const size_t n = mine.size(), G = size_t(p.members);
  if (p.in_rows * size_t(width) != whole.size() || p.out_rows * size_t(width) != G * n)
    throw Error("part exchange: reduce-scatter buffers of " + std::to_string(whole.size()) + " and " +
                std::to_string(n) + " values do not match the pieces");
  std::vector<T> stage(G * n);
  {
    Timed tm{traffic_, double((G - 1) * n * sizeof(T))};
    MpiRowTransport t(e.comm);
    run_plan(p, t, whole.data(), stage.data(), size_t(width) * sizeof(T));
  }
  for (size_t i = 0; i < n; ++i) {
    T sum = 0;
    for (size_t m = 0; m < G; ++m) sum += stage[m * n + i];
    mine[i] = sum;
  }
}

void PartGroups::gather_blocks(const DocPart& sh, std::span<const double> mine, std::span<double> whole, int width,
                                int bs) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  std::vector<std::vector<Piece>> blocks;  // every member's pieces in blocks
  for (const auto& ps : e.pieces) {
    blocks.emplace_back();
    for (auto [b, x] : ps) blocks.back().push_back({b / bs, (x + bs - 1) / bs});
  }
  allgather_pieces(e.comm, blocks, mine, whole, width, traffic_);
}

PartNeeds PartGroups::share_needs(const DocPart& sh, const std::vector<Piece>& mine) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  std::vector<int32_t> flat;  // b0, e0, b1, e1, ...
  for (auto [b, x] : mine) flat.insert(flat.end(), {b, x});
  const std::vector<int> counts = e.comm.allgather(int(flat.size()));
  std::vector<int32_t> all(size_t(std::accumulate(counts.begin(), counts.end(), 0)));
  Timed tm{traffic_, double((all.size() - flat.size()) * sizeof(int32_t))};
  e.comm.allgatherv(std::span<const int32_t>(flat), std::span<int32_t>(all), counts);
  PartNeeds nd;
  nd.member = e.comm.rank();
  nd.need.resize(counts.size());
  size_t at = 0;
  for (size_t m = 0; m < counts.size(); ++m)
    for (int i = 0; i < counts[m]; i += 2, at += 2) nd.need[m].push_back({all[at], all[at + 1]});
  for (int m = 0; m < int(nd.need.size()); ++m) nd.selective_rows += nd.rows(m);
  nd.allgather_rows = int64_t(e.comm.size() - 1) * e.doc_len;
  return nd;
}

template <class T>
void PartGroups::fetch(const DocPart& sh, const PartNeeds& nd, std::span<const T> mine, std::span<T> got,
                        int width) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  const int G = e.comm.size(), me = e.comm.rank();
  std::vector<int> sc(size_t(G), 0), rc(size_t(G), 0);
  std::vector<T> send;  // for each member, the rows of its segments this rank owns, in its need order
  for (int m = 0; m < G; ++m)
    for (const OwnedRange& g : segments(e.pieces, nd.need[size_t(m)]))
      if (g.owner == me) {
        const size_t r = local_row(e.pieces[size_t(me)], g.b);
        send.insert(send.end(), mine.begin() + r * width, mine.begin() + (r + size_t(g.e - g.b)) * width);
        sc[size_t(m)] += (g.e - g.b) * width;
      }
  const std::vector<OwnedRange> my = segments(e.pieces, nd.need[size_t(me)]);
  for (const OwnedRange& g : my) rc[size_t(g.owner)] += (g.e - g.b) * width;
  std::vector<T> recv(got.size());
  {
    Timed tm{traffic_, double(recv.size() * sizeof(T))};
    e.comm.alltoallv(std::span<const T>(send), sc, std::span<T>(recv), rc);
  }
  std::vector<size_t> cursor(size_t(G) + 1, 0);  // owner o's next value in recv
  for (int o = 0; o < G; ++o) cursor[size_t(o) + 1] = cursor[size_t(o)] + size_t(rc[size_t(o)]);
  size_t at = 0;
  for (const OwnedRange& g : my) {
    const size_t n = size_t(g.e - g.b) * width;
    std::copy_n(recv.begin() + cursor[size_t(g.owner)], n, got.begin() + at);
    cursor[size_t(g.owner)] += n, at += n;
  }
}

template <class T>
void PartGroups::give_back(const DocPart& sh, const PartNeeds& nd, std::span<const T> got, std::span<T> mine,
                            int width) const {
  const Entry& e = *groups_.at(size_t(sh.group));
  const int me = e.comm.rank(), G = e.comm.size();
  const std::vector<OwnedRange> my = segments(e.pieces, nd.need[size_t(me)]);  // what this rank fetched
  std::vector<int> sc(size_t(G), 0), rc(size_t(G), 0);
  std::vector<size_t> got_at(my.size() + 1, 0);  // segment i's rows in got
  for (size_t i = 0; i < my.size(); ++i) got_at[i + 1] = got_at[i] + size_t(my[i].e - my[i].b) * width;
  std::vector<T> send;  // grouped by owner, in need order
  for (int o = 0; o < G; ++o)
    for (size_t i = 0; i < my.size(); ++i)
      if (my[i].owner == o) {
        send.insert(send.end(), got.begin() + got_at[i], got.begin() + got_at[i + 1]);
        sc[size_t(o)] += int(got_at[i + 1] - got_at[i]);
      }
  std::vector<std::vector<OwnedRange>> theirs(static_cast<size_t>(G));
  for (int m = 0; m < G; ++m)
    for (const OwnedRange& g : segments(e.pieces, nd.need[size_t(m)]))
      if (g.owner == me) theirs[size_t(m)].push_back(g), rc[size_t(m)] += (g.e - g.b) * width;
  std::vector<T> recv(size_t(std::accumulate(rc.begin(), rc.end(), 0)));
  {
    Timed tm{traffic_, double(recv.size() * sizeof(T))};
    e.comm.alltoallv(std::span<const T>(send), sc, std::span<T>(recv), rc);
  }
  size_t at = 0;  // members in order: a fixed order of the sums
  for (int m = 0; m < G; ++m)
    for (const OwnedRange& g : theirs[size_t(m)]) {
      const size_t r = local_row(e.pieces[size_t(me)], g.b), n = size_t(g.e - g.b) * width;
      for (size_t i = 0; i < n; ++i) mine[r * width + i] += recv[at + i];
      at += n;
    }
}

template <class T>
PartExchange<T> PartGroups::bind() const {
  PartExchange<T> ex;
  ex.gather = [this](const DocPart& sh, std::span<const T> mine, std::span<T> whole, int width) {
    gather(sh, mine, whole, width);
  };
  ex.reduce_scatter = [this](const DocPart& sh, std::span<const T> whole, std::span<T> mine, int width) {
    reduce_scatter(sh, whole, mine, width);
  };
  ex.gather_blocks = [this](const DocPart& sh, std::span<const double> mine, std::span<double> whole, int width,
                            int bs) { gather_blocks(sh, mine, whole, width, bs); };
  ex.share_needs = [this](const DocPart& sh, const std::vector<Piece>& mine) { return share_needs(sh, mine); };
  ex.fetch = [this](const DocPart& sh, const PartNeeds& nd, std::span<const T> mine, std::span<T> got, int width) {
    fetch(sh, nd, mine, got, width);
  };
  ex.give_back = [this](const DocPart& sh, const PartNeeds& nd, std::span<const T> got, std::span<T> mine,
                        int width) { give_back(sh, nd, got, mine, width); };
  return ex;
}

// After bind's definition, which it instantiates.
PartGroups::PartGroups(const Comm& world) : world_(world), ex32_(bind<float>()), ex64_(bind<double>()) {}

}  // namespace sb
