// The host logic of a split document's attention (DocPart, model.hpp) that the CPU path
// (part_attention.cpp) and the CUDA path (part_attention_cuda.cpp) share.
#pragma once
#include "kernels/kernels.hpp"
#include "src/model/model.hpp"

namespace sb {

// Throws std::logic_error unless sh.pieces are ascending and on the block grid (as DocPart says).
void check_part_pieces(const DocPart& sh, int block_size);

// sel was built over the whole document (one sequence of sh.doc_len tokens): keeps only the rows
// (kv head g, query block i) whose query block this rank owns, empties the others, and returns the
// statistics of the kept rows (so the group's sum is one rank's).
kernels::GatingStats keep_own_rows(const DocPart& sh, kernels::AttnShape s, kernels::BlockSelection& sel);

// The token ranges of the blocks that the rows kept in `sel` (after keep_own_rows) use and other
// members own, merged and ascending: what the selective exchange fetches.
std::vector<std::pair<int32_t, int32_t>> needed_ranges(const DocPart& sh, const kernels::BlockSelection& sel, int bs);

}  // namespace sb
