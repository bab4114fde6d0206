// Context parallelism (issue 21) on 1, 2 and 4 real MPI ranks: one document of G micro-batches
// split over the G = world ranks, each rank also holding a short document of its own, gives the
// loss, the gradients and the gating statistics of one rank holding everything in one micro-batch:
// dense and sparse attention, GQA and one kv head, float32 and float64. Then the trainer with
// data.long_docs = "split": the same loss as whole documents, bit-exact resume, the rank error.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "base/bf16.hpp"
#include "base/error.hpp"
#include "base/hash.hpp"
#include "io/checkpoint.hpp"
#include "src/comm/comm.hpp"
#include "src/comm/row_exchange.hpp"
#include "src/parts/groups.hpp"
#include "src/train/trainer.hpp"
#include "train_test_util.hpp"

namespace {

constexpr int kCap = 128, kBlock = 8;  // train.micro_batch_tokens, attention.block_size of the case

sb::ModelDims dims(int kv_heads) {
  sb::ModelDims d;
  d.n_layers = 2, d.d_model = 32, d.n_heads = 4, d.n_kv_heads = kv_heads, d.head_dim = 8, d.ffn_dim = 48;
  d.vocab = 50;
  return d;
}

std::vector<uint32_t> random_doc(size_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> t(len);
  for (auto& x : t) x = uint32_t(rng() % 50);
  return t;
}

template <class T>
MPI_Datatype mpi_type() {
  return sizeof(T) == 4 ? MPI_FLOAT : MPI_DOUBLE;
}

struct Case {
  bool sparse;
  int kv_heads;
  int tail;  // the long document is G * kCap - tail tokens (a partial last block when not a multiple of 8)
  int len = 0;  // else this many tokens (fewer blocks than 2G chunks: members without a piece)
  std::vector<uint8_t> dense = {};  // attention.dense_layers' flags (empty: none)
  sb::kernels::GateQuery query = sb::kernels::GateQuery::mean;  // the gate mode
  sb::kernels::GateKey key = sb::kernels::GateKey::mean;
};

template <class T>
void check_case(const Case& c, double tol, sb::PartExchangeMode mode = sb::PartExchangeMode::AllGather) {
  sb::Comm comm;
  const int G = comm.size(), me = comm.rank();
  const int32_t L = c.len > 0 ? c.len : G * kCap - c.tail;
  const std::vector<uint32_t> doc = random_doc(size_t(L), 11);
  sb::AttnSettings a;
  a.sparse = c.sparse, a.block_size = kBlock, a.local_blocks = 1, a.theta = 1e9, a.k = {1, 2};
  a.dense = c.dense, a.gate_query = c.query, a.gate_key = c.key, a.gate_sub_blocks = 4;

  sb::Model<T> ref(dims(c.kv_heads)), cp(dims(c.kv_heads));
  ref.init(5), cp.init(5);
  // One rank's micro-batch: every rank's short document, then the long one, whole.
  sb::PackedBatch whole;
  for (int r = 0; r < G; ++r) whole.add(random_doc(size_t(10 + 7 * r), 100 + uint64_t(r)));
  whole.add(doc);
  const sb::MicroBatchStats rs = ref.forward_backward(whole, a, T(1));

  // This rank's micro-batch: its short document, then its pieces of the long one.
  sb::PartGroups groups(comm);
  groups.set_mode(mode);
  const auto costs = sb::block_costs(L, kBlock, c.sparse, 2, a.local_blocks, 0.1);
  sb::DocPart sh = groups.add(0, L, sb::split_document(L, G, kBlock, costs)).value();
  sb::PackedBatch mine;
  mine.add(random_doc(size_t(10 + 7 * me), 100 + uint64_t(me)));
  for (auto [b, e] : sh.pieces)
    mine.add_rows(std::vector<uint32_t>(doc.begin() + b, doc.begin() + std::min(e + 1, L)), b, size_t(e - b));
  mine.parts.push_back(sh);
  const sb::PartExchange<T>& ex = [&]() -> const sb::PartExchange<T>& {
    if constexpr (sizeof(T) == 4) return groups.exchange_f32();
    else return groups.exchange_f64();
  }();
  const sb::MicroBatchStats ms = cp.forward_backward(mine, a, T(1), &ex);

  std::vector<double> sums = {ms.loss_sum, double(ms.targets)};
  for (const auto& g : ms.gating) sums.insert(sums.end(), {g.rows, g.kept_blocks, g.causal_blocks, g.recall_sum});
  comm.allreduce_sum_inplace(sums);
  EXPECT_NEAR(sums[0], rs.loss_sum, tol * std::abs(rs.loss_sum));
  EXPECT_EQ(int64_t(sums[1]), rs.targets);
  for (size_t l = 0; l < rs.gating.size(); ++l) {  // the same blocks kept: exactly one rank's selection
    EXPECT_EQ(sums[2 + 4 * l], rs.gating[l].rows) << "layer " << l;
    EXPECT_EQ(sums[3 + 4 * l], rs.gating[l].kept_blocks) << "layer " << l;
    EXPECT_EQ(sums[4 + 4 * l], rs.gating[l].causal_blocks) << "layer " << l;
    EXPECT_NEAR(sums[5 + 4 * l], rs.gating[l].recall_sum, 1e-5 * rs.gating[l].recall_sum) << "layer " << l;
  }
  for (size_t l = 0; c.sparse && c.len == 0 && l < rs.gating.size(); ++l) {  // the sparse layers drop blocks
    if (l < c.dense.size() && c.dense[l]) EXPECT_DOUBLE_EQ(rs.gating[l].density(), 1.0) << "dense layer " << l;
    else EXPECT_LT(rs.gating[l].density(), l == 0 ? 0.5 : 0.9) << "layer " << l;  // budgets 1, 2
  }

  std::vector<T>& g = cp.grads();
  MPI_Allreduce(MPI_IN_PLACE, g.data(), int(g.size()), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  for (const auto& p : ref.params()) {  // per tensor: |g - g_ref| / |g_ref| in the L2 norm
    double diff = 0, norm = 0;
    for (size_t i = p.offset; i < p.offset + p.size; ++i) {
      diff += std::pow(double(g[i]) - double(ref.grads()[i]), 2);
      norm += std::pow(double(ref.grads()[i]), 2);
    }
    EXPECT_LE(std::sqrt(diff), tol * std::sqrt(norm) + 1e-30) << p.name;
  }
}

const Case kCases[] = {{false, 2, 0}, {true, 2, 0}, {true, 1, 5}, {false, 4, 3}, {true, 2, 0, 21}};

TEST(Part, OneDocumentOverTheWorldEqualsOneRankFloat32) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.sparse ? "sparse" : "dense") + ", kv heads " + std::to_string(c.kv_heads));
    check_case<float>(c, 1e-5);
  }
}

TEST(Part, OneDocumentOverTheWorldEqualsOneRankFloat64) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.sparse ? "sparse" : "dense") + ", kv heads " + std::to_string(c.kv_heads));
    check_case<double>(c, 1e-11);
  }
}

// Hybrid layers (attention.dense_layers) and the gate modes (attention.gate_query, gate_key) through
// context parallelism: the all-gather, and the selective exchange whose shared key summaries have
// two (bounds) or four (sub) rows per block.
TEST(Part, HybridLayersAndGateModesEqualOneRank) {
  using Q = sb::kernels::GateQuery;
  using K = sb::kernels::GateKey;
  const Case cases[] = {{true, 2, 0, 0, {0, 1}, Q::max, K::bounds}, {true, 1, 5, 0, {1, 0}, Q::mean, K::sub},
                        {true, 2, 0, 0, {}, Q::max, K::sub}};
  for (const Case& c : cases)
    for (auto mode : {sb::PartExchangeMode::AllGather, sb::PartExchangeMode::Selective}) {
      SCOPED_TRACE("kv heads " + std::to_string(c.kv_heads) + ", key " + std::to_string(int(c.key)) +
                   (mode == sb::PartExchangeMode::Selective ? ", selective" : ", all-gather"));
      check_case<double>(c, 1e-11, mode);
    }
}

// The selective exchange (attention.part_exchange = "selective"): gating on the shared pooled keys
// keeps one rank's blocks, only those blocks' K/V rows travel, their dK/dV return to the owners.
TEST(Part, SelectiveExchangeEqualsOneRank) {
  for (int i : {0, 2, 4}) {  // dense GQA; sparse, one kv head, a partial block; members without a piece
    const Case& c = kCases[i];
    SCOPED_TRACE(std::string(c.sparse ? "sparse" : "dense") + ", kv heads " + std::to_string(c.kv_heads));
    check_case<double>(c, 1e-11, sb::PartExchangeMode::Selective);
  }
  check_case<float>(kCases[1], 1e-5, sb::PartExchangeMode::Selective);  // sparse GQA
  check_case<float>(kCases[1], 1e-5, sb::PartExchangeMode::Auto);
}

// Group::alltoallv: member r sends r + 1 + m values "100 r + m" to member m (none to itself at
// odd r), in float and double.
TEST(Part, GroupAlltoallvDeliversEachMembersPart) {
  sb::Comm comm;
  sb::Group g(comm, 0, comm.rank());
  const int G = g.size(), me = g.rank();
  auto count = [](int from, int to) { return from % 2 == 1 && from == to ? 0 : from + 1 + to; };
  std::vector<int> sc, rc;
  std::vector<double> send;
  for (int m = 0; m < G; ++m) {
    sc.push_back(count(me, m)), rc.push_back(count(m, me));
    for (int i = 0; i < count(me, m); ++i) send.push_back(100.0 * me + m + 0.5 * i);
  }
  std::vector<double> recv(size_t(std::accumulate(rc.begin(), rc.end(), 0)));
  g.alltoallv(std::span<const double>(send), sc, std::span<double>(recv), rc);
  std::vector<float> sendf(send.begin(), send.end()), recvf(recv.size());
  g.alltoallv(std::span<const float>(sendf), sc, std::span<float>(recvf), rc);
  size_t at = 0;
  for (int r = 0; r < G; ++r)
    for (int i = 0; i < count(r, me); ++i, ++at) {
      EXPECT_EQ(recv[at], 100.0 * r + me + 0.5 * i) << "from " << r;
      EXPECT_EQ(recvf[at], float(100.0 * r + me + 0.5 * i)) << "from " << r;
    }
  EXPECT_EQ(at, recv.size());
  rc[0] += 1;  // counts that disagree with the buffer are an error naming the call
  EXPECT_THROW(g.alltoallv(std::span<const double>(send), sc, std::span<double>(recv), rc), std::exception);
}

// The row plans of the device exchange (src/comm/row_exchange.hpp) on MPI with host buffers, as the
// GPU's host-staged path runs them and NCCL runs them on device buffers: random tilings of a
// document (several pieces a member, members without any), random bf16 rows. The gather gives every
// member the whole document bit for bit (and the same rows as PartGroups' allgatherv path in
// float); the reduce-scatter gives each owner the fp32 sum in member order of every member's rows,
// rounded once.
TEST(Part, RowPlansGatherAndReduceScatterExactly) {
  sb::Comm comm;
  sb::Group g(comm, 0, comm.rank());
  const int G = g.size(), me = g.rank(), W = 3;
  EXPECT_EQ(sb::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(sb::f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // a tie rounds to even
  EXPECT_EQ(sb::f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(sb::bf16_to_f32(0xc0a0), -5.0f);
  for (int trial = 0; trial < 6; ++trial) {
    std::mt19937_64 rng(uint64_t(77 + trial));  // the same on every rank
    const int32_t L = int32_t(40 + rng() % 160);
    std::vector<sb::RowRanges> pieces(static_cast<size_t>(G));
    for (int32_t b = 0; b < L;) {  // pieces of 1-24 tokens to random members (member 0 none in trial 1)
      const int32_t e = std::min(L, b + 1 + int32_t(rng() % 24));
      int m = int(rng() % uint64_t(G));
      if (trial == 1 && G > 1 && m == 0) m = 1;
      pieces[size_t(m)].push_back({b, e});
      b = e;
    }
    // value of member m's row t in the reduce-scatter (and of row t in the gather: m = -1)
    auto value = [&](int m, int32_t t, int j) {
      std::mt19937 r(uint32_t(1000003 * (m + 1) + 31 * t + j));
      return sb::f32_to_bf16(std::uniform_real_distribution<float>(-4, 4)(r));
    };
    std::vector<uint16_t> mine;
    for (auto [b, e] : pieces[size_t(me)])
      for (int32_t t = b; t < e; ++t)
        for (int j = 0; j < W; ++j) mine.push_back(value(-1, t, j));
    sb::MpiRowTransport tr(g);
    const sb::RowPlan gp = sb::gather_plan(pieces, me, L);
    std::vector<uint16_t> whole(size_t(L) * W);
    sb::run_plan(gp, tr, mine.data(), whole.data(), W * sizeof(uint16_t));
    int bad = 0;  // counted, not asserted: a member leaving early would hang the others
    for (int32_t t = 0; t < L; ++t)
      for (int j = 0; j < W; ++j) bad += whole[size_t(t) * W + j] != value(-1, t, j);
    EXPECT_EQ(bad, 0) << "gathered values differ, trial " << trial;

    std::vector<uint16_t> contrib(size_t(L) * W);  // this member's rows for every owner
    for (int32_t t = 0; t < L; ++t)
      for (int j = 0; j < W; ++j) contrib[size_t(t) * W + j] = value(me, t, j);
    const sb::RowPlan sp = sb::scatter_plan(pieces, me, L);
    std::vector<uint16_t> stage(sp.out_rows * W), sum(mine.size());
    sb::run_plan(sp, tr, contrib.data(), stage.data(), W * sizeof(uint16_t));
    sb::sum_blocks_bf16(stage.data(), G, mine.size(), sum.data());
    size_t at = 0;
    for (auto [b, e] : pieces[size_t(me)])
      for (int32_t t = b; t < e; ++t)
        for (int j = 0; j < W; ++j, ++at) {
          float s = 0;
          for (int m = 0; m < G; ++m) s += sb::bf16_to_f32(value(m, t, j));
          bad += sum[at] != sb::f32_to_bf16(s);
        }
    EXPECT_EQ(bad, 0) << "sums differ, trial " << trial;

    // The same gather in float as PartGroups' path (allgatherv and reorder): the same rows.
    sb::PartGroups groups(comm);
    const sb::DocPart sh = groups.add(0, L, pieces).value();
    std::vector<float> minef(mine.size()), wf(whole.size()), wg(whole.size());
    for (size_t i = 0; i < mine.size(); ++i) minef[i] = sb::bf16_to_f32(mine[i]);
    sb::run_plan(gp, tr, minef.data(), wf.data(), W * sizeof(float));
    groups.exchange_f32().gather(sh, minef, wg, W);
    EXPECT_EQ(wf, wg);
  }
  std::vector<sb::RowRanges> gap(static_cast<size_t>(G));  // pieces that leave a row without an owner
  gap[0] = {{0, 5}, {6, 10}};
  EXPECT_THROW(sb::gather_plan(gap, me, 10), sb::Error);
}

// DST gives the members of a group different budgets (balance.tuning = "dst"). Each member gates
// only its own rows, at its own budget, so what it computes for its rows is what it computes when
// every member runs its budget: with one layer (the keys are the embeddings', whatever the others
// keep) its rows' loss, with two its rows' first-layer selection, to the bit.
TEST(Part, MembersAtDifferentBudgetsKeepTheirOwnRowsChoice) {
  sb::Comm comm;
  const int G = comm.size(), me = comm.rank();
  if (G == 1) GTEST_SKIP() << "one member has one budget";
  const int32_t L = G * kCap;
  const std::vector<uint32_t> doc = random_doc(size_t(L), 11);
  sb::PartGroups groups(comm);
  const auto costs = sb::block_costs(L, kBlock, true, 2, 1, 0.1);
  const sb::DocPart sh = groups.add(0, L, sb::split_document(L, G, kBlock, costs)).value();
  sb::PackedBatch mine;
  mine.add(random_doc(size_t(10 + 7 * me), 100 + uint64_t(me)));
  for (auto [b, e] : sh.pieces)
    mine.add_rows(std::vector<uint32_t>(doc.begin() + b, doc.begin() + std::min(e + 1, L)), b, size_t(e - b));
  mine.parts.push_back(sh);
  const int k_mine = 1 + me % 3;  // 1, 2, 3, 1: the members differ
  for (int layers : {1, 2}) {
    SCOPED_TRACE("layers " + std::to_string(layers));
    sb::ModelDims d = dims(2);
    d.n_layers = layers;
    auto run = [&](int k) {
      sb::AttnSettings a;
      a.sparse = true, a.block_size = kBlock, a.local_blocks = 1, a.theta = 1e9, a.k.assign(size_t(layers), k);
      sb::Model<float> m(d);
      m.init(5);
      return m.forward_backward(mine, a, 1.0f, &groups.exchange_f32());
    };
    const sb::MicroBatchStats mixed = run(k_mine);
    std::vector<double> kept;
    for (int k = 1; k <= 3; ++k) {  // every member at budget k
      const sb::MicroBatchStats same = run(k);
      kept.push_back(same.gating[0].kept_blocks);
      if (k != k_mine) continue;
      const auto &g = mixed.gating[0], &h = same.gating[0];
      EXPECT_EQ(g.rows, h.rows);
      EXPECT_EQ(g.kept_blocks, h.kept_blocks);
      EXPECT_EQ(g.recall_sum, h.recall_sum);
      if (layers == 1) {
        EXPECT_EQ(mixed.loss_sum, same.loss_sum);
      }
    }
    EXPECT_LT(kept[0], kept[2]);  // the budgets do change this member's rows' selection
  }
}

// The split: every token owned once, block-aligned pieces, zigzag for equal costs, work balanced.
TEST(Part, SplitCoversTheDocumentAndBalancesWork) {
  const int64_t len = 4 * kCap * 4 - 3;  // 256 blocks, the last partial
  for (int G : {1, 2, 4, 8}) {
    for (bool sparse : {false, true}) {
      const auto costs = sb::block_costs(len, kBlock, sparse, 2, 1, 0.0);
      const auto parts = sb::split_document(len, G, kBlock, costs);
      ASSERT_EQ(int(parts.size()), G);
      std::vector<int> owner(size_t(len), -1);
      std::vector<double> work(size_t(G), 0.0);
      for (int r = 0; r < G; ++r)
        for (auto [b, e] : parts[size_t(r)]) {
          EXPECT_EQ(b % kBlock, 0);
          for (int32_t t = b; t < e; ++t) {
            EXPECT_EQ(owner[size_t(t)], -1);
            owner[size_t(t)] = r;
          }
          for (int32_t i = b / kBlock; i * kBlock < e; ++i) work[size_t(r)] += costs[size_t(i)];
        }
      for (int o : owner) EXPECT_GE(o, 0);
      const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
      const double biggest = *std::max_element(costs.begin(), costs.end());
      for (double w : work) EXPECT_LE(std::abs(w - total / G), 2 * biggest) << "G " << G;
    }
  }
  // Dense with equal token costs: Megatron's zigzag, member r holding chunks r and 2G-1-r.
  const std::vector<double> flat(8, 1.0);
  const auto z = sb::split_document(8 * kBlock, 2, kBlock, flat);
  EXPECT_EQ(z[0], (std::vector<sb::Piece>{{0, 16}, {48, 64}}));
  EXPECT_EQ(z[1], (std::vector<sb::Piece>{{16, 48}}));
}

TEST(Part, TooFewRanksSaysHowManyAreNeeded) {
  sb::Comm comm;
  sb::PartGroups groups(comm);
  std::vector<std::vector<sb::Piece>> parts(size_t(comm.size() + 1));
  try {
    groups.add(0, 100, parts);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(comm.size() + 1) + " ranks"), std::string::npos)
        << e.what();
  }
}

}  // namespace

// ---- data.long_docs = "split" in the trainer (the tiny corpus: documents up to 1,024 tokens)

namespace trainer {

using namespace sbtest;

// The deterministic policies (plans independent of measured times).
std::string flags(int cap) {
  return " --set balance.batching=tokens --set balance.tuning=fixed --set balance.self_profile=false"
         " --set train.micro_batch_tokens=" + std::to_string(cap);
}

uint64_t weights_hash(const sb::Trainer& t) {
  const auto& w = t.model().weights();
  return sb::fnv1a(w.data(), w.size() * sizeof(float));
}

// One micro-batch of 1,024 tokens holds every document whole; splitting the long ones over ranks of
// 1024 / ranks tokens each trains the same documents with the same math: the losses agree to float
// rounding (the first, at the initial weights, to 1e-5), and the split run resumes bit-exactly.
TEST(PartTrain, LongDocumentsSplitTrainAsWholeAndResumeBitExact) {
  sb::Comm comm;
  const int R = comm.size();
  if (R == 1) GTEST_SKIP() << "splitting needs 2 ranks or more (the error is checked below)";
  const std::string dir = scratch(comm, "part");
  const int cap = 1024 / R;
  sb::Config whole = tiny_config(dir, flags(1024) + " --set train.steps=3 --set log.path=" + dir + "/whole.h5");
  sb::Trainer tw(whole, comm, "", 0);
  const sb::TrainResult rw = tw.run();
  const std::string base = flags(cap) + " --set data.long_docs=split --set train.steps=3 --set checkpoint.every=2";
  sb::Config one = tiny_config(dir, base + " --set log.path=" + dir + "/one.h5 --set checkpoint.dir=" + dir + "/c1");
  sb::Trainer t1(one, comm, "", 0);
  const sb::TrainResult r1 = t1.run();
  {  // the case is not vacuous: the steps' global batches have documents to split
    const sb::Settings& set = t1.settings();
    sb::Dataset ds = sb::Dataset::open(set.data.path);
    sb::DataCursor cur;
    std::vector<uint64_t> order;
    int64_t long_docs = 0;
    for (int s = 0; s < 3; ++s)
      for (auto [doc, len] :
           sb::draw_global_batch(ds, set.data.seed, set.data.val_fraction, set.train.global_batch_tokens, cur, order).docs)
        long_docs += int64_t(len) > cap;
    EXPECT_GT(long_docs, 0);
  }
  EXPECT_NEAR(r1.first_loss, rw.first_loss, 1e-5 * rw.first_loss);
  ASSERT_EQ(r1.losses.size(), rw.losses.size());
  for (size_t i = 0; i < rw.losses.size(); ++i) EXPECT_NEAR(r1.losses[i], rw.losses[i], 1e-4 * rw.losses[i]) << "step " << i + 1;
  EXPECT_EQ(r1.last_step, 3);
  EXPECT_TRUE(comm.all_equal(weights_hash(t1)));
  // balance.tuning = "fixed": every rank's rows of the documents in parts at k0 = attention.k.
  EXPECT_GT(t1.part_budgets().items, 0);
  EXPECT_EQ(t1.part_budgets().lo, t1.settings().balance.dst.k0);
  EXPECT_EQ(t1.part_budgets().hi, t1.settings().balance.dst.k0);

  // balance.split_docs: at 4 ranks (fair share 512 tokens) documents that fit 1,024 are split too;
  // here through the selective K/V exchange (the run above: auto).
  sb::Config fit = tiny_config(dir, flags(1024) + " --set data.long_docs=split --set balance.split_docs=true"
                                    " --set attention.part_exchange=selective"
                                    " --set train.steps=3 --set log.path=" + dir + "/fit.h5 --set checkpoint.dir=" + dir + "/c3");
  sb::Trainer tf(fit, comm, "", 0);
  const sb::TrainResult rf = tf.run();
  ASSERT_EQ(rf.losses.size(), rw.losses.size());
  for (size_t i = 0; i < rw.losses.size(); ++i) EXPECT_NEAR(rf.losses[i], rw.losses[i], 1e-4 * rw.losses[i]) << "step " << i + 1;

  const std::string c2 = dir + "/c2";
  sb::Config two = tiny_config(dir, base + " --set log.path=" + dir + "/two.h5 --set checkpoint.dir=" + c2);
  {
    sb::Trainer a(two, comm, "", 2);
    a.run();
  }
  sb::Trainer b(two, comm, sb::checkpoint_path(c2, 2), 0);
  const sb::TrainResult rb = b.run();
  EXPECT_EQ(rb.last_step, 3);
  EXPECT_EQ(weights_hash(b), weights_hash(t1));
}

// balance.tuning = "dst" on documents in parts: each rank tunes the budgets of its own rows of a
// document toward T* (a rank below it raises them, one above lowers them), so the members of a
// group run one document at different budgets. balance.ema = 0 keeps the latency model as planned
// (no correction from measured times): the budgets, and so the run, are deterministic and resume
// bit-exactly.
TEST(PartTrain, DstTunesEachRanksRowsOfSplitDocuments) {
  sb::Comm comm;
  const int R = comm.size();
  if (R == 1) GTEST_SKIP() << "splitting needs 2 ranks or more";
  const std::string dir = scratch(comm, "part_dst");
  const std::string base = flags(1024 / R) + " --set data.long_docs=split --set balance.tuning=dst --set balance.ema=0"
                           " --set balance.max_change=0.5 --set attention.k=6 --set train.steps=3 --set checkpoint.every=2";
  const std::string c1 = dir + "/c1", c2 = dir + "/c2";
  sb::Config one = tiny_config(dir, base + " --set log.path=" + dir + "/one.h5 --set checkpoint.dir=" + c1);
  sb::Trainer t1(one, comm, "", 0);
  const sb::TrainResult r1 = t1.run();
  EXPECT_EQ(r1.last_step, 3);
  const sb::Trainer::PartBudgets& b = t1.part_budgets();
  const int k0 = t1.settings().balance.dst.k0;
  EXPECT_GT(comm.allreduce_max(double(b.items)), 0);
  EXPECT_GE(b.items == 0 ? 3 : b.lo, 3);  // k0 (1 -+ max_change)
  EXPECT_LE(b.items == 0 ? 9 : b.hi, 9);
  // Somewhere in the run a member raised its rows' budgets and another lowered its own.
  EXPECT_GT(comm.allreduce_max(double(b.items > 0 && b.hi > k0)), 0) << "no split part above k0";
  EXPECT_GT(comm.allreduce_max(double(b.items > 0 && b.lo < k0)), 0) << "no split part below k0";
  EXPECT_TRUE(comm.all_equal(weights_hash(t1)));
  sb::Config two = tiny_config(dir, base + " --set log.path=" + dir + "/two.h5 --set checkpoint.dir=" + c2);
  {
    sb::Trainer a(two, comm, "", 2);
    a.run();
  }
  sb::Trainer rb(two, comm, sb::checkpoint_path(c2, 2), 0);
  EXPECT_EQ(rb.run().last_step, 3);
  EXPECT_EQ(weights_hash(rb), weights_hash(t1));
}

TEST(PartTrain, TooFewRanksNamesHowManyAreNeeded) {
  sb::Comm comm;
  const std::string dir = scratch(comm, "part_few");
  // 32 tokens per rank: a document of more than 128 tokens needs more than 4 ranks.
  sb::Config cfg = tiny_config(dir, flags(32) + " --set data.long_docs=split --set train.steps=1");
  try {
    sb::Trainer t(cfg, comm, "", 0);
    t.run();
    FAIL() << "no error";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks, and the run has " + std::to_string(comm.size())), std::string::npos) << m;
    EXPECT_NE(m.find("data.long_docs"), std::string::npos) << m;
  }
}

}  // namespace trainer
