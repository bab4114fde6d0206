// Context parallelism (data.long_docs = "split", issue 21): how a document is split over a group of
// ranks, and the exchange of its rows within the group (MPI, through src/comm's Group) that the
// model is handed (PartExchange in src/model/model.hpp). src/balance/README.md, "Documents in parts",
// says when to split and what it costs.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "src/balance/part_split.hpp"
#include "src/comm/comm.hpp"
#include "src/model/model.hpp"

namespace sb {

// Piece, block_costs, split_document, piece_batch: src/balance/part_split.hpp (shared with `simulate`).

// The linear layers' flops per token in units of one kept key block of one query block (all heads):
// block_costs's token_cost for this model.
double token_cost(const ModelDims& d, int block_size);

// The groups of this rank's documents in parts and the MPI exchange of their rows. One instance
// lives as long as the DocParts that name its groups.
class PartGroups {
 public:
  explicit PartGroups(const Comm& world);
  PartGroups(const PartGroups&) = delete;
  PartGroups& operator=(const PartGroups&) = delete;
  // Collective over every rank of the world: a group of the world ranks [first, first + pieces.size())
  // computing one document; member r holds pieces[r] (a rank outside the group may pass G empty lists). Returns this rank's DocPart (group set,
  // pieces its own, perhaps none), nothing when this rank is not a member.
  std::optional<DocPart> add(int first, int32_t doc_len, std::vector<std::vector<Piece>> pieces);
  void clear() { groups_.clear(); }
  // The functions the model calls; they reference this object.
  const PartExchange<float>& exchange_f32() const { return ex32_; }
  const PartExchange<double>& exchange_f64() const { return ex64_; }
  void set_mode(PartExchangeMode m) { ex32_.mode = m, ex64_.mode = m; }  // attention.part_exchange
  // What this rank's exchanges moved since the last reset: bytes it received (the all-gather's
  // (G - 1) * L rows, the reduce-scatter's (G - 1) * its rows, the selective exchange's fetched
  // rows and returned gradients, the pooled keys and needs), and the seconds spent in them.
  struct Traffic {
    double bytes = 0, seconds = 0;
  };
  const Traffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = {}; }
  // Group g as the device exchange (groups_cuda.hpp) needs it: its MPI group, every member's pieces,
  // its first world rank (member m is world rank first + m).
  struct View {
    const Group& comm;
    const std::vector<std::vector<Piece>>& pieces;
    int first;
    int32_t doc_len;
  };
  View view(int g) const;

 private:
  struct Entry {
    Group comm;
    std::vector<std::vector<Piece>> pieces;  // every member's
    int32_t doc_len = 0;
    int first = 0;
  };
  template <class T>
  void gather(const DocPart& sh, std::span<const T> mine, std::span<T> whole, int width) const;
  template <class T>
  void reduce_scatter(const DocPart& sh, std::span<const T> whole, std::span<T> mine, int width) const;
  template <class T>
  void fetch(const DocPart& sh, const PartNeeds& nd, std::span<const T> mine, std::span<T> got, int width) const;
  template <class T>
  void give_back(const DocPart& sh, const PartNeeds& nd, std::span<const T> got, std::span<T> mine, int width) const;
  void gather_blocks(const DocPart& sh, std::span<const double> mine, std::span<double> whole, int width, int bs) const;
  PartNeeds share_needs(const DocPart& sh, const std::vector<Piece>& mine) const;
  template <class T>
  PartExchange<T> bind() const;

  const Comm& world_;
  std::vector<std::unique_ptr<Entry>> groups_;
  PartExchange<float> ex32_;
  PartExchange<double> ex64_;
  mutable Traffic traffic_;
};

}  // namespace sb
