// eval --diagnose: where sparse attention loses the synthetic tasks' retrieval (issue 48). For each
// task document of the validation split (its last train.micro_batch_tokens window), with the engine's
// model (CPU or CUDA):
//   - the needle: the first occurrence of the answer's tokens in the window before the question (the
//     synthetic tasks put the answer's value in the evidence only once: passkey digits, a multi-key
//     needle's number, the kv pair's value); its key block(s) are the needle blocks;
//   - per layer and kv head, on the answer rows (the query blocks holding the positions that predict
//     the answer): the rank of the best needle block in the gate's mean-pooled score order (1 = the
//     top-scored causal block), whether the gate kept every needle block, and the true recall
//     (kernels::true_recall: the dense softmax mass on the kept blocks) beside the gate's own
//     estimate; the same two recalls on eval.diagnose_rows sampled rows per layer;
//   - the task accuracy (exact match, teacher-forced, as eval) with dense attention, sparse at k0, the
//     oracle gate (the needle blocks forced into every row after gating, kernels::force_blocks), and
//     one layer at a time dense (the rest sparse) and one layer at a time sparse (the rest dense).
// A layer "dense" inside a sparse pass keeps every causal block (kernels::select_all_causal): the same
// selection and kernel as the dense pass. Written as JSON (README.md, "eval --diagnose";
// bench/analysis/diagnose_table.py renders it as Markdown).
#pragma once
#include <nlohmann/json.hpp>

#include "io/shard.hpp"
#include "src/comm/comm.hpp"
#include "src/engine/engine.hpp"
#include "src/train/settings.hpp"

namespace sb {

// The needle span [begin, end) (document offsets) of a task document: the first occurrence of the
// answer's tokens in toks (the document's tokens from window_begin on) before the answer; {0, 0}
// when it is not in the window.
std::pair<uint64_t, uint64_t> find_needle(const std::vector<uint32_t>& toks, uint64_t window_begin, const TaskSpan& task);

// The diagnostics over eval.docs validation documents, spread over ranks (the same JSON on every rank).
nlohmann::json diagnose(const Settings& s, const Comm& comm, Engine& engine, const Dataset& ds);

}  // namespace sb
