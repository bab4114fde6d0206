#include "src/eval/evaluate.hpp"

#include <sstream>

#include "base/error.hpp"
#include "src/train/batch.hpp"

namespace sb {

static std::vector<int64_t> parse_buckets(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t pos = 0;
      long long v = std::stoll(item, &pos);
      if (pos != item.size() || v <= 0 || (!out.empty() && v <= out.back())) throw 0;
      out.push_back(v);
    } catch (...) {
      throw Error("eval.buckets = \"" + text + "\": expected increasing positive integers separated by commas");
    }
  }
  return out;
}

static void add_doc(EvalPart& part, const MicroBatchStats& st, const std::vector<int32_t>& argmax,
                    const std::vector<uint32_t>& toks, size_t bucket, size_t src, const TaskSpan& task, uint64_t window_begin) {
  part.loss_sum += st.loss_sum, part.targets += st.targets;
  part.source_loss[src] += st.loss_sum, part.source_targets[src] += st.targets;
  part.bucket_loss[bucket] += st.loss_sum, part.bucket_targets[bucket] += st.targets;
  if (task.type == 0 || task.type >= 4 || task.end <= task.begin || task.begin <= window_begin) return;
  // Exact match of the greedy next-token predictions over the answer span, teacher-forced.
  bool ok = true;
  for (uint64_t t = task.begin; t < task.end; ++t) {
    uint64_t i = t - window_begin;  // position of the answer token in the window
    if (argmax[i - 1] != int32_t(toks[i])) ok = false;
  }
  part.task_total[task.type] += 1;
  part.task_correct[task.type] += ok;
  part.bucket_task_total[bucket][task.type] += 1;
  part.bucket_task_correct[bucket][task.type] += ok;
}

// span_accuracy: the record (window) is right when every trained target is the greedy prediction.
// mask (the window's loss mask): position i predicts token i+1, trained iff mask[i+1].
static void add_span(EvalPart& part, const std::vector<int32_t>& argmax, const std::vector<uint32_t>& toks,
                     const std::vector<uint8_t>& mask, size_t bucket) {
  int64_t trained = 0;
  bool ok = true;
  for (size_t i = 0; i + 1 < toks.size(); ++i)
    if (mask[i + 1]) trained += 1, ok = ok && argmax[i] == int32_t(toks[i + 1]);
  if (!trained) return;
  part.span_total += 1, part.span_correct += ok;
  part.bucket_span_total[bucket] += 1, part.bucket_span_correct[bucket] += ok;
}

EvalResult evaluate(const Settings& s, const Comm& comm, Engine& engine, const Dataset& ds) {
  EvalResult res;
  res.bucket_bounds = parse_buckets(s.eval.buckets);
  const size_t nb = res.bucket_bounds.size() + 1, ns = ds.num_sources();
  for (EvalPart* p : {&res.dense, &res.sparse}) {
    p->bucket_loss.assign(nb, 0), p->bucket_targets.assign(nb, 0);
    p->bucket_task_correct.assign(nb, {}), p->bucket_task_total.assign(nb, {});
    p->bucket_span_correct.assign(nb, 0), p->bucket_span_total.assign(nb, 0);
    p->source_loss.assign(ns, 0), p->source_targets.assign(ns, 0);
  }
  res.source_docs.assign(ns, 0);
  auto val = ds.val_docs(s.data.seed, s.data.val_fraction);
  if (val.empty()) throw Error(ds.path() + ": no validation documents (raise data.val_fraction)");
  if (int64_t(val.size()) > s.eval.docs) val.resize(size_t(s.eval.docs));
  res.doc_ids = val;
  const int64_t cap = s.train.micro_batch_tokens;
  // Every document twice: dense, and sparse at the default budget k0 (whatever attention.mode says).
  AttnSettings dense = s.attention.at_k0(s.model.n_layers, s.balance.dst.k0), sparse = dense;
  dense.sparse = false;
  sparse.sparse = true;
  for (size_t i = size_t(comm.rank()); i < val.size(); i += size_t(comm.size())) {
    uint64_t doc = val[i], len = ds.doc_length(doc);
    if (len < 2) continue;
    uint64_t begin = len > uint64_t(cap) ? len - uint64_t(cap) : 0;  // the window holding the end
    const Segment seg{doc, begin, len - begin};
    std::vector<uint32_t> toks = read_segment(ds, seg);
    PackedBatch b;
    b.add(toks);
    size_t bucket = 0;
    while (bucket < res.bucket_bounds.size() && int64_t(len) > res.bucket_bounds[bucket]) ++bucket;
    TaskSpan task = ds.task(doc);
    const size_t src = ds.source_of(doc);
    std::vector<int32_t> argmax;
    const std::vector<uint8_t> mask = ds.has_masks() ? ds.read_mask(doc, begin, toks.size()) : std::vector<uint8_t>();
    add_doc(res.dense, engine.forward(b, dense, &argmax), argmax, toks, bucket, src, task, begin);
    if (!mask.empty()) add_span(res.dense, argmax, toks, mask, bucket);
    add_doc(res.sparse, engine.forward(b, sparse, &argmax), argmax, toks, bucket, src, task, begin);
    if (!mask.empty()) add_span(res.sparse, argmax, toks, mask, bucket);
    if (ds.has_masks()) {  // a third, dense pass: the loss over the trained targets only
      mask_targets(ds, seg, b, 0);
      MicroBatchStats m = engine.forward(b, dense, nullptr);
      res.masked_loss_sum += m.loss_sum, res.masked_targets += m.targets;
    }
    res.docs += 1, res.tokens += int64_t(toks.size()), res.source_docs[src] += 1;
  }
  // Sum over ranks: pack every counter into one vector of doubles.
  std::vector<double> v;
  auto put = [&](EvalPart& p) {
    v.push_back(p.loss_sum), v.push_back(double(p.targets));
    for (size_t j = 0; j < nb; ++j) v.push_back(p.bucket_loss[j]), v.push_back(double(p.bucket_targets[j]));
    for (int t = 0; t < 4; ++t) v.push_back(double(p.task_correct[t])), v.push_back(double(p.task_total[t]));
    for (size_t j = 0; j < nb; ++j)
      for (int t = 0; t < 4; ++t) v.push_back(double(p.bucket_task_correct[j][t])), v.push_back(double(p.bucket_task_total[j][t]));
    v.push_back(double(p.span_correct)), v.push_back(double(p.span_total));
    for (size_t j = 0; j < nb; ++j) v.push_back(double(p.bucket_span_correct[j])), v.push_back(double(p.bucket_span_total[j]));
    for (size_t j = 0; j < ns; ++j) v.push_back(p.source_loss[j]), v.push_back(double(p.source_targets[j]));
  };
  put(res.dense), put(res.sparse);
  v.push_back(double(res.docs)), v.push_back(double(res.tokens));
  v.push_back(res.masked_loss_sum), v.push_back(double(res.masked_targets));
  for (size_t j = 0; j < ns; ++j) v.push_back(double(res.source_docs[j]));
  comm.allreduce_sum_inplace(v);
  size_t at = 0;
  auto get = [&](EvalPart& p) {
    p.loss_sum = v[at++], p.targets = int64_t(v[at++]);
    for (size_t j = 0; j < nb; ++j) p.bucket_loss[j] = v[at++], p.bucket_targets[j] = int64_t(v[at++]);
    for (int t = 0; t < 4; ++t) p.task_correct[t] = int64_t(v[at++]), p.task_total[t] = int64_t(v[at++]);
    for (size_t j = 0; j < nb; ++j)
      for (int t = 0; t < 4; ++t) p.bucket_task_correct[j][t] = int64_t(v[at++]), p.bucket_task_total[j][t] = int64_t(v[at++]);
    p.span_correct = int64_t(v[at++]), p.span_total = int64_t(v[at++]);
    for (size_t j = 0; j < nb; ++j) p.bucket_span_correct[j] = int64_t(v[at++]), p.bucket_span_total[j] = int64_t(v[at++]);
    for (size_t j = 0; j < ns; ++j) p.source_loss[j] = v[at++], p.source_targets[j] = int64_t(v[at++]);
  };
  get(res.dense), get(res.sparse);
  res.docs = int64_t(v[at++]), res.tokens = int64_t(v[at++]);
  res.masked_loss_sum = v[at++], res.masked_targets = int64_t(v[at++]);
  for (size_t j = 0; j < ns; ++j) res.source_docs[j] = int64_t(v[at++]);
  res.masked = ds.has_masks();
  return res;
}

}  // namespace sb
