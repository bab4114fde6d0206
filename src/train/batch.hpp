// The step's data: draw the global batch from the data cursor (identical on every rank; the plan
// that splits it over ranks x micro-batches is src/balance/plan.hpp), and read and pack the
// micro-batches this rank computes.
#pragma once
#include <cstdint>
#include <vector>

#include "io/shard.hpp"
#include "src/balance/segment.hpp"
#include "src/model/model.hpp"
#include "src/train/settings.hpp"

namespace sb {

// Where the next document comes from: position in the epoch's shuffled training order.
struct DataCursor {
  int64_t epoch = 0, index = 0;
};

// The training documents in the order of `epoch`: the dataset's seeded split and shuffle for
// epoch 0, reshuffled by (seed, epoch) for later epochs.
std::vector<uint64_t> epoch_order(const Dataset& ds, uint64_t seed, double val_fraction, int64_t epoch);

struct GlobalBatch {
  std::vector<std::pair<uint64_t, uint64_t>> docs;  // (doc id, length), in data order
  int64_t tokens = 0;
  std::vector<int64_t> source_docs, source_tokens;  // per source (Dataset::num_sources): drawn this batch
};

// Whole documents from the cursor until `tokens` are reached (at least one document); the
// cursor advances and wraps into the next epoch.
GlobalBatch draw_global_batch(const Dataset& ds, uint64_t seed, double val_fraction, int64_t tokens, DataCursor& cur,
                              std::vector<uint64_t>& order);

// data.sources: where the next document comes from. The n-th document drawn (n = draws) comes
// from the source that a hash of (data.seed, n) picks by weight, at that source's own position
// in its own epoch order (its training split shuffled as epoch_order does one dataset's, epoch 0
// the split's order). These numbers are the whole state: a checkpoint stores them and a resume
// continues bit for bit, on any rank count.
struct MixCursor {
  std::vector<int64_t> epochs, indexes;  // per source
  int64_t draws = 0;
};

// The source of the n-th document drawn: the first i with u < w[0] + ... + w[i], u in [0, 1)
// from (seed, n) alone. `weights` normalised (DataSettings::sources).
size_t pick_source(const std::vector<double>& weights, uint64_t seed, int64_t n);
// Source `src`'s training documents in the order of `epoch` (global ids). Errors name
// data.sources[src].path when the split leaves it no document of positive length.
std::vector<uint64_t> source_epoch_order(const Dataset& ds, size_t src, uint64_t seed, double val_fraction, int64_t epoch);

// As draw_global_batch, each document from the source pick_source names; a source that runs out
// goes on with its next epoch. `orders` caches each source's current epoch order (empty: rebuilt
// from the cursor, as after a resume).
GlobalBatch draw_mixture_batch(const Dataset& ds, const std::vector<double>& weights, uint64_t seed, double val_fraction,
                               int64_t tokens, MixCursor& cur, std::vector<std::vector<uint64_t>>& orders);

// The run's data: data.path's dataset, or data.sources' mixture (Dataset::open_sources).
Dataset open_data(const DataSettings& d);

// Training targets of a set of segments. Position t of a segment predicts its token t+1 and is
// trained iff the loss mask of that token is 1: a segment of L tokens has L-1 targets without a
// mask, sum(mask[1..L)) with one. Called with the whole global batch on every rank, so the loss
// (a mean over the global batch's trained targets) does not depend on the rank count.
int64_t count_targets(const Dataset& ds, const std::vector<Segment>& segs);

// compute: read a micro-batch's windows from the shards and pack them (cu_seqlens); targets whose
// token has loss mask 0 are -1 (not trained).
PackedBatch pack_micro_batch(const Dataset& ds, const MicroBatch& mb);
// compute, data.long_docs = "split": this rank's pieces of one split document (mb.segs, one per
// piece of `sh`), each row targeting the document's next token even where another rank owns it.
PackedBatch pack_part(const Dataset& ds, const MicroBatch& mb, const DocPart& sh);
// Sets to -1 the targets of segment `s`, packed into `b` from token `at` on, whose token has loss
// mask 0 (nothing without masks).
void mask_targets(const Dataset& ds, const Segment& s, PackedBatch& b, size_t at);
std::vector<uint32_t> read_segment(const Dataset& ds, const Segment& s);

}  // namespace sb
