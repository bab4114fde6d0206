#include "src/parts/step_batches.hpp"

#include <algorithm>
#include <optional>

namespace sb {

PartTimes part_times(const LatencyModel& lm, const MicroBatch& mb, int64_t doc_len, std::span<const int> k, int64_t n) {
  const MicroBatch whole{{Segment{0, 0, uint64_t(doc_len)}}, doc_len};  // (costs ignore the id)
  const PartTimes p = lm.micro_batch_parts(whole, k);
  const double share = double(n) / double(doc_len);
  return {p.attention * share + lm.part_gating_ms(mb, doc_len), 0, p.linear * share};
}

RankBatches plan_step_batches(const std::vector<std::pair<uint64_t, uint64_t>>& global, const BatchingSettings& s,
                              const LatencyModel& lm, const ModelDims& dims, const Comm& comm, PartGroups& groups) {
  const int R = comm.size(), me = comm.rank();
  const int64_t cap = s.micro_batch_tokens;
  RankBatches out;
  // The long documents' groups first, their load the plan's preload.
  std::vector<std::pair<uint64_t, uint64_t>> docs = global;
  std::vector<double> preload;
  const double kv_bytes = 4.0 * dims.n_kv_heads * dims.head_dim;
  const std::vector<PartGroup> split =
      s.parts ? place_long_docs(docs, cap, R, s.batching, lm, s.k0, kv_bytes, s.part_costly, preload, s.part_share)
              : std::vector<PartGroup>{};
  out.segs = make_segments(docs, cap, s.reject_long);
  int64_t tokens = 0;
  for (const auto& d : docs) tokens += int64_t(d.second);
  const int M = int(std::max<int64_t>(1, (tokens + int64_t(R) * cap - 1) / (int64_t(R) * cap)));
  // One plan over all ranks, or (balance.group_ranks) only this rank's group's plan: the same
  // micro-batches as the whole two-level plan would give this rank, at a fraction of the cost.
  if (s.plan.group_ranks > 0 && s.plan.group_ranks < R && s.batching != Batching::Sequential) {
    GroupPlan gp = make_group_plan(out.segs, R, M, cap, s.batching, lm, s.k0, s.plan, me);
    out.mine = std::move(gp.ranks[size_t(me - gp.first_rank)]);
  } else {
    Plan p = make_plan(out.segs, R, M, cap, s.batching, lm, s.k0, s.plan, preload);
    out.mine = std::move(p.ranks[size_t(me)]);
  }
  out.planned = out.mine.size();
  out.exchange_ms.assign(out.planned, 0.0);
  groups.clear();
  const AttnSettings& at = s.attention;
  for (const PartGroup& d : split) {  // every rank in the same order: the groups are made collectively
    out.split.push_back({d.doc, 0, d.len});
    std::vector<std::vector<Piece>> pieces(size_t(d.ranks));  // a rank outside the group needs only its size
    if (me >= d.first && me < d.first + d.ranks)
      pieces = split_document(int64_t(d.len), d.ranks, at.block_size,
                              block_costs(int64_t(d.len), at.block_size, at.sparse, s.k0, at.local_blocks, token_cost(dims, at.block_size),
                                          lm.dense_share()));
    std::optional<DocPart> sh = groups.add(d.first, int32_t(d.len), std::move(pieces));
    if (!sh) continue;
    out.mine.push_back(piece_batch(d.doc, sh->pieces));
    out.exchange_ms.push_back(part_exchange_ms(lm, int64_t(d.len), d.ranks, kv_bytes));
    out.parts.push_back(std::move(*sh));
  }
  return out;
}

}  // namespace sb
