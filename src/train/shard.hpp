// Context parallelism (data.long_docs = "shard", issue 21): how a document is split over a group of
// ranks, and the exchange of its rows within the group (MPI, through src/comm's Group) that the
// model is handed (ShardExchange in src/model/model.hpp). src/balance/README.md, "Sharded documents",
// says when to shard and what it costs.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "src/comm/comm.hpp"
#include "src/model/model.hpp"

namespace sb {

using Piece = std::pair<int32_t, int32_t>;  // [begin, end) tokens of the document

// The predicted work of each query block of a document of `len` tokens: `token_cost` per token
// (the linear layers) plus one unit per kept key block (attention). Dense attention keeps i + 1
// blocks in block row i; sparse attention at budget k keeps at most the anchors (sink, w local,
// diagonal) and k more, so its rows stop growing at k + w + 2.
std::vector<double> block_costs(int64_t len, int block_size, bool sparse, int k, int local_blocks,
                                double token_cost);

// The linear layers' flops per token in units of one kept key block of one query block (all heads):
// block_costs's token_cost for this model.
double token_cost(const ModelDims& d, int block_size);

// The pieces of each of G members: the document's blocks cut into 2G contiguous chunks of equal
// predicted work (`costs`, one per block), member r taking chunks r and 2G-1-r (adjacent chunks of
// one member merge). With equal costs this is Megatron's zigzag; with sparse costs the early
// chunks, whose rows keep fewer blocks, grow longer. Every piece is block-aligned.
std::vector<std::vector<Piece>> split_document(int64_t len, int G, int block_size, std::span<const double> costs);

// The groups of this rank's sharded documents and the MPI exchange of their rows. One instance
// lives as long as the DocShards that name its groups.
class ShardGroups {
 public:
  explicit ShardGroups(const Comm& world);
  ShardGroups(const ShardGroups&) = delete;
  ShardGroups& operator=(const ShardGroups&) = delete;
  // Collective over every rank of the world: a group of the world ranks [first, first + pieces.size())
  // computing one document; member r holds pieces[r]. Returns this rank's DocShard (group set,
  // pieces its own, perhaps none), nothing when this rank is not a member.
  std::optional<DocShard> add(int first, int32_t doc_len, std::vector<std::vector<Piece>> pieces);
  void clear() { groups_.clear(); }
  // The functions the model calls; they reference this object.
  const ShardExchange<float>& exchange_f32() const { return ex32_; }
  const ShardExchange<double>& exchange_f64() const { return ex64_; }
  void set_mode(ShardExchangeMode m) { ex32_.mode = m, ex64_.mode = m; }  // attention.shard_exchange
  // What this rank's exchanges moved since the last reset: bytes it received (the all-gather's
  // (G - 1) * L rows, the reduce-scatter's (G - 1) * its rows, the selective exchange's fetched
  // rows and returned gradients, the pooled keys and needs), and the seconds spent in them.
  struct Traffic {
    double bytes = 0, seconds = 0;
  };
  const Traffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = {}; }

 private:
  struct Entry {
    Group comm;
    std::vector<std::vector<Piece>> pieces;  // every member's
    int32_t doc_len = 0;
  };
  template <class T>
  void gather(const DocShard& sh, std::span<const T> mine, std::span<T> whole, int width) const;
  template <class T>
  void reduce_scatter(const DocShard& sh, std::span<const T> whole, std::span<T> mine, int width) const;
  template <class T>
  void fetch(const DocShard& sh, const ShardNeeds& nd, std::span<const T> mine, std::span<T> got, int width) const;
  template <class T>
  void give_back(const DocShard& sh, const ShardNeeds& nd, std::span<const T> got, std::span<T> mine, int width) const;
  void gather_blocks(const DocShard& sh, std::span<const double> mine, std::span<double> whole, int width, int bs) const;
  ShardNeeds share_needs(const DocShard& sh, const std::vector<Piece>& mine) const;
  template <class T>
  ShardExchange<T> bind() const;

  const Comm& world_;
  std::vector<std::unique_ptr<Entry>> groups_;
  ShardExchange<float> ex32_;
  ShardExchange<double> ex64_;
  mutable Traffic traffic_;
};

}  // namespace sb
