// The one entry the trainer's plan phase calls: a step's global batch in, this rank's micro-batches
// out, the parts of documents split over a group of ranks included (data.long_docs = "split").
// Long documents are placed on rank groups first (place_long_docs), their load is the plan's
// preload, the plan (SAB, src/balance/plan.hpp) places the rest, then every rank joins the groups
// collectively and gets one micro-batch per part it holds, split by work (split_document).
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "src/balance/latency_model.hpp"
#include "src/balance/plan.hpp"
#include "src/model/model.hpp"
#include "src/parts/groups.hpp"

namespace sb {

// What the plan of one step acts on (from the typed settings, Settings::batching()).
struct BatchingSettings {
  int64_t micro_batch_tokens = 0;  // train.micro_batch_tokens: a micro-batch's capacity
  Batching batching = Batching::Sparse;
  PlanOptions plan;
  int k0 = 4;                      // balance.dst.k0 (= attention.k): the budget the plan costs at
  bool reject_long = false;        // data.long_docs = "reject" (neither this nor parts: windows)
  bool parts = false;              // data.long_docs = "split": long documents in parts over rank groups
  bool part_costly = false;        // balance.split_docs: costly documents that fit are split too
  double part_share = 1.0;         // balance.part_share: their parts cost at most this x the fair share
  AttnSettings attention;          // block_size, local_blocks, sparse (k unused): the parts' split by work
};

// This rank's micro-batches of one step: the plan's first, then one per part it holds.
struct RankBatches {
  std::vector<Segment> segs;        // the global batch's planned segments (whole documents or windows)
  std::vector<MicroBatch> mine;     // this rank's micro-batches
  size_t planned = 0;               // mine[0, planned): the plan's; mine[planned + i]: parts[i]
  std::vector<DocPart> parts;      // the parts this rank holds, their groups in `groups`
  std::vector<double> exchange_ms;  // [micro-batch] a part's K/V exchange (DST's prediction), 0 for planned ones
  std::vector<Segment> split;       // the documents split into parts, whole (for the target count)
};

// A part's predicted times for the step's records: mb (its pieces, n of the document's doc_len
// rows) as its share of the whole document's attention and linear layers at budgets k, plus its
// gating (its rows' or the whole document's, lm.part_gating()) counted as attention.
PartTimes part_times(const LatencyModel& lm, const MicroBatch& mb, int64_t doc_len, std::span<const int> k, int64_t n);

// Collective over every rank of `comm` (the groups are made in the same order everywhere).
// `docs`: the global batch's (document, length) pairs; `groups` is cleared and refilled (the parts
// name its groups, so it must outlive them). Errors as place_long_docs and make_segments.
RankBatches plan_step_batches(const std::vector<std::pair<uint64_t, uint64_t>>& docs, const BatchingSettings& s,
                              const LatencyModel& lm, const ModelDims& dims, const Comm& comm, PartGroups& groups);

}  // namespace sb
