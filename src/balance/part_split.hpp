// How a split document (data.long_docs = "split") is cut over its group of ranks, on costs only:
// the trainer (src/parts/groups.*, which then moves the rows) and `simulate` both use it, so a
// modelled member holds exactly the rows a real one would and DST costs them the same way
// (build_items with the document's length).
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "src/balance/latency_model.hpp"
#include "src/balance/segment.hpp"

namespace sb {

using Piece = std::pair<int32_t, int32_t>;  // [begin, end) tokens of the document

// The predicted work of each query block of a document of `len` tokens: `token_cost` per token
// (the linear layers) plus one unit per kept key block (attention). Dense attention keeps i + 1
// blocks in block row i; sparse attention at budget k keeps at most the anchors (sink, w local,
// diagonal) and k more, so its rows stop growing at k + w + 2. dense_share: the share of the layers
// that stay dense in a sparse run (attention.dense_layers; LatencyModel::dense_share): their rows
// keep i + 1 blocks, the row's cost the layers' mean.
std::vector<double> block_costs(int64_t len, int block_size, bool sparse, int k, int local_blocks,
                                double token_cost, double dense_share = 0.0);

// block_costs' token_cost from a latency model (what `simulate`, which has no model dimensions,
// uses): the token-linear time of one layer (linear / n_layers + attention's per-token term) over
// the attention time of one kept block pair.
double token_cost(const LatencyModel& lm);

// The pieces of each of G members: the document's blocks cut into 2G contiguous chunks, member r
// taking chunks r and 2G-1-r (adjacent chunks of one member merge). The chunks are of equal
// predicted work (`costs`, one per block: with sparse costs the early chunks, whose rows keep fewer
// blocks, grow longer) or of equal length (Megatron's zigzag), whichever leaves the busiest member
// less work (zigzag for dense rows, whose linear growth its pairs cancel). Every piece is block-aligned.
std::vector<std::vector<Piece>> split_document(int64_t len, int G, int block_size, std::span<const double> costs);

// A member's pieces of document `doc` as its extra micro-batch (segments [begin, begin + len) of
// the document): what build_items costs with the document's length as `doc_len`.
MicroBatch piece_batch(uint64_t doc, std::span<const Piece> pieces);

}  // namespace sb
