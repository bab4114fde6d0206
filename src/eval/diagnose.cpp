#include "src/eval/diagnose.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"
#include "src/train/batch.hpp"

namespace sb {

namespace k = kernels;

std::pair<uint64_t, uint64_t> find_needle(const std::vector<uint32_t>& toks, uint64_t window_begin, const TaskSpan& task) {
  if (task.type == 0 || task.end <= task.begin || task.begin < window_begin) return {0, 0};
  const auto ans = toks.begin() + int64_t(task.begin - window_begin), ans_end = toks.begin() + int64_t(task.end - window_begin);
  const auto at = std::search(toks.begin(), ans, ans, ans_end);
  if (at == ans) return {0, 0};
  const uint64_t b = window_begin + uint64_t(at - toks.begin());
  return {b, b + (task.end - task.begin)};
}

namespace {

// The counters of the whole run, summed over ranks as one vector of doubles.
struct Tally {
  int L = 0, Hkv = 0, passes = 0;
  std::vector<double> correct, total;  // [pass][task type 0..3]
  // [layer][head]: answer rows measured, rank sum, rows with every needle block kept, candidate sum
  // (causal blocks of the row); every answer row's count, true and gate recall sums; sampled rows' too.
  std::vector<double> rows, rank, kept, cand, arows, rt, rg, srows, srt, srg;
  double docs = 0, needles = 0;
  Tally(int L_, int Hkv_, int passes_) : L(L_), Hkv(Hkv_), passes(passes_) {
    correct.assign(size_t(passes) * 4, 0), total.assign(size_t(passes) * 4, 0);
    for (auto* v : {&rows, &rank, &kept, &cand, &arows, &rt, &rg, &srows, &srt, &srg}) v->assign(size_t(L) * Hkv, 0);
  }
  std::vector<std::vector<double>*> all() {
    return {&correct, &total, &rows, &rank, &kept, &cand, &arows, &rt, &rg, &srows, &srt, &srg};
  }
};

// Mean-pooled gate scores of query block i against key blocks 0..i of kv head g (kernels/cpu/gating.cpp's
// s_ij, in double): one document of L tokens at q (L, H, D), kk (L, Hkv, D).
std::vector<double> gate_scores(const float* q, const float* kk, int L, int g, int i, k::AttnShape s) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, Bs = s.block_size, G = H / Hkv;
  std::vector<double> qb(static_cast<size_t>(D), 0.0), kb(static_cast<size_t>(D)), out(static_cast<size_t>(i) + 1);
  const int t0 = i * Bs, n = std::min(Bs, L - t0);
  for (int t = t0; t < t0 + n; t++)
    for (int h = g * G; h < (g + 1) * G; h++)
      for (int d = 0; d < D; d++) qb[size_t(d)] += q[(int64_t(t) * H + h) * D + d];
  for (int d = 0; d < D; d++) qb[size_t(d)] /= double(n) * G;
  for (int j = 0; j <= i; j++) {
    std::fill(kb.begin(), kb.end(), 0.0);
    const int u0 = j * Bs, m = std::min(Bs, L - u0);
    for (int t = u0; t < u0 + m; t++)
      for (int d = 0; d < D; d++) kb[size_t(d)] += kk[(int64_t(t) * Hkv + g) * D + d];
    double acc = 0;
    for (int d = 0; d < D; d++) acc += qb[size_t(d)] * (kb[size_t(d)] / double(m));
    out[size_t(j)] = acc / std::sqrt(double(D));
  }
  return out;
}

bool kept_all(const k::BlockSelection& sel, int64_t row, const std::vector<int32_t>& blocks, int i) {
  for (int32_t j : blocks) {
    if (j > i) continue;
    const auto b = sel.cols.begin() + sel.row_ptr[size_t(row)], e = sel.cols.begin() + sel.row_ptr[size_t(row) + 1];
    if (!std::binary_search(b, e, j)) return false;
  }
  return true;
}

}  // namespace

nlohmann::json diagnose(const Settings& s, const Comm& comm, Engine& engine, const Dataset& ds) {
  const int L = s.model.n_layers, Hkv = s.model.n_kv_heads, Bs = s.attention.block_size;
  const k::AttnShape shape{s.model.n_heads, Hkv, s.model.head_dim, Bs};
  // Passes: 0 dense, 1 sparse, 2 oracle, 3 + l layer l dense (rest sparse), 3 + L + l layer l sparse (rest dense).
  const int passes = 3 + 2 * L;
  Tally tl(L, Hkv, passes);
  auto val = ds.val_docs(s.data.seed, s.data.val_fraction);
  if (val.empty()) throw Error(ds.path() + ": no validation documents (raise data.val_fraction)");
  if (int64_t(val.size()) > s.eval.docs) val.resize(size_t(s.eval.docs));
  const int64_t cap = s.train.micro_batch_tokens;
  AttnSettings dense = s.attention.at_k0(L, s.balance.dst.k0), sparse = dense;
  dense.sparse = false, sparse.sparse = true;
  for (size_t v = size_t(comm.rank()); v < val.size(); v += size_t(comm.size())) {
    const uint64_t doc = val[v], len = ds.doc_length(doc);
    const TaskSpan task = ds.task(doc);
    if (len < 2 || task.type == 0 || task.type >= 4) continue;
    const uint64_t begin = len > uint64_t(cap) ? len - uint64_t(cap) : 0;
    if (task.begin <= begin) continue;  // the answer must be predicted inside the window
    const std::vector<uint32_t> toks = read_segment(ds, Segment{doc, begin, len - begin});
    PackedBatch b;
    b.add(toks);
    const int n = b.n();
    const auto [nb0, nb1] = find_needle(toks, begin, task);
    std::vector<int32_t> needle;  // key blocks of the needle (window-local)
    if (nb1 > nb0)
      for (int j = int((nb0 - begin) / uint64_t(Bs)); j <= int((nb1 - 1 - begin) / uint64_t(Bs)); j++) needle.push_back(j);
    // Answer rows: the query blocks of positions task.begin - 1 .. task.end - 2 (they predict the answer).
    const int qa = int((task.begin - 1 - begin) / uint64_t(Bs)), qz = int((task.end - 2 - begin) / uint64_t(Bs));
    const int nblk = (n + Bs - 1) / Bs;
    tl.docs += 1, tl.needles += !needle.empty();
    auto right = [&](const std::vector<int32_t>& am) {
      for (uint64_t t = task.begin; t < task.end; ++t)
        if (am[size_t(t - begin - 1)] != int32_t(toks[size_t(t - begin)])) return false;
      return true;
    };
    auto run = [&](int pass, const AttnSettings& a, SelectionProbe probe) {
      std::vector<int32_t> am;
      engine.set_probe(std::move(probe));
      engine.forward(b, a, &am);
      engine.set_probe({});
      tl.total[size_t(pass) * 4 + task.type] += 1;
      tl.correct[size_t(pass) * 4 + task.type] += right(am);
    };
    run(0, dense, {});
    // The sparse pass measures: needle ranks, kept, true against gate recall.
    run(1, sparse, [&](int l, const float* q, const float* kk, k::BlockSelection& sel) {
      for (int g = 0; g < Hkv; g++) {
        const size_t at = size_t(l) * Hkv + g;
        std::vector<int64_t> rows;
        for (int i = qa; i <= qz; i++) rows.push_back(int64_t(g) * nblk + i);
        std::vector<float> tr(rows.size());
        k::true_recall(q, kk, b.cu_seqlens.data(), 1, shape, sel, rows.data(), int(rows.size()), tr.data());
        for (size_t r = 0; r < rows.size(); r++) {
          const int i = qa + int(r);
          tl.arows[at] += 1, tl.rt[at] += tr[r], tl.rg[at] += sel.recall[size_t(rows[r])];
          if (needle.empty() || needle.front() > i) continue;
          const std::vector<double> sc = gate_scores(q, kk, n, g, i, shape);
          double best = -INFINITY;
          for (int32_t j : needle)
            if (j <= i) best = std::max(best, sc[size_t(j)]);
          int rank = 1;
          for (double x : sc) rank += x > best;
          tl.rows[at] += 1, tl.rank[at] += rank, tl.cand[at] += i + 1;
          tl.kept[at] += kept_all(sel, rows[r], needle, i);
        }
      }
      const int64_t all_rows = sel.doc_row_base.back();
      const std::vector<int64_t> pick = recall_sample(all_rows, s.eval.diagnose_rows, l, n);
      std::vector<float> tr(pick.size());
      k::true_recall(q, kk, b.cu_seqlens.data(), 1, shape, sel, pick.data(), int(pick.size()), tr.data());
      for (size_t r = 0; r < pick.size(); r++) {
        const size_t at = size_t(l) * Hkv + size_t(k::place_row(sel, b.cu_seqlens.data(), 1, shape, pick[r]).g);
        tl.srows[at] += 1, tl.srt[at] += tr[r], tl.srg[at] += sel.recall[size_t(pick[r])];
      }
    });
    run(2, sparse, [&](int, const float*, const float*, k::BlockSelection& sel) {
      if (!needle.empty()) k::force_blocks(sel, b.cu_seqlens.data(), 1, shape, 0, needle);
    });
    for (int m = 0; m < L; m++) {
      // layer m dense, the rest sparse; then layer m sparse, the rest dense
      run(3 + m, sparse, [&](int l, const float*, const float*, k::BlockSelection& sel) {
        if (l == m) k::select_all_causal(b.cu_seqlens.data(), 1, shape, sel);
      });
      run(3 + L + m, sparse, [&](int l, const float*, const float*, k::BlockSelection& sel) {
        if (l != m) k::select_all_causal(b.cu_seqlens.data(), 1, shape, sel);
      });
    }
  }
  // Sum over ranks.
  std::vector<double> flat;
  for (auto* v : tl.all()) flat.insert(flat.end(), v->begin(), v->end());
  flat.push_back(tl.docs), flat.push_back(tl.needles);
  comm.allreduce_sum_inplace(flat);
  size_t at = 0;
  for (auto* v : tl.all())
    for (double& x : *v) x = flat[at++];
  tl.docs = flat[at++], tl.needles = flat[at++];

  auto acc = [&](int pass) {
    nlohmann::json j = nlohmann::json::object();
    double c = 0, t = 0;
    for (int ty = 1; ty < 4; ty++) {
      const double cc = tl.correct[size_t(pass) * 4 + ty], tt = tl.total[size_t(pass) * 4 + ty];
      if (tt == 0) continue;
      j[task_name(ty)] = {{"correct", int64_t(cc)}, {"total", int64_t(tt)}, {"accuracy", cc / tt}};
      c += cc, t += tt;
    }
    j["overall"] = {{"correct", int64_t(c)}, {"total", int64_t(t)}, {"accuracy", t > 0 ? c / t : 0.0}};
    return j;
  };
  auto mean = [](double sum, double count) { return count > 0 ? nlohmann::json(sum / count) : nlohmann::json(nullptr); };
  nlohmann::json layers = nlohmann::json::array(), dense_layer = nlohmann::json::array(), sparse_layer = nlohmann::json::array();
  for (int l = 0; l < L; l++) {
    nlohmann::json heads = nlohmann::json::array();
    double r = 0, rk = 0, kp = 0, cd = 0, ar = 0, rt = 0, rg = 0, sr = 0, srt = 0, srg = 0;
    for (int g = 0; g < Hkv; g++) {
      const size_t i = size_t(l) * Hkv + g;
      heads.push_back({{"head", g}, {"needle_rows", int64_t(tl.rows[i])}, {"needle_rank", mean(tl.rank[i], tl.rows[i])},
                       {"needle_kept", mean(tl.kept[i], tl.rows[i])}, {"candidates", mean(tl.cand[i], tl.rows[i])},
                       {"answer_rows", int64_t(tl.arows[i])}, {"recall_true_answer", mean(tl.rt[i], tl.arows[i])},
                       {"recall_gate_answer", mean(tl.rg[i], tl.arows[i])}, {"sampled_rows", int64_t(tl.srows[i])},
                       {"recall_true_sampled", mean(tl.srt[i], tl.srows[i])},
                       {"recall_gate_sampled", mean(tl.srg[i], tl.srows[i])}});
      r += tl.rows[i], rk += tl.rank[i], kp += tl.kept[i], cd += tl.cand[i];
      ar += tl.arows[i], rt += tl.rt[i], rg += tl.rg[i], sr += tl.srows[i], srt += tl.srt[i], srg += tl.srg[i];
    }
    layers.push_back({{"layer", l}, {"needle_rank", mean(rk, r)}, {"needle_kept", mean(kp, r)}, {"candidates", mean(cd, r)},
                      {"recall_true_answer", mean(rt, ar)}, {"recall_gate_answer", mean(rg, ar)},
                      {"recall_true_sampled", mean(srt, sr)}, {"recall_gate_sampled", mean(srg, sr)}, {"heads", heads}});
    dense_layer.push_back(acc(3 + l));
    sparse_layer.push_back(acc(3 + L + l));
  }
  return {{"docs", int64_t(tl.docs)}, {"docs_with_needle", int64_t(tl.needles)}, {"layers_n", L}, {"kv_heads", Hkv},
          {"block_size", Bs}, {"k", s.balance.dst.k0}, {"local_blocks", s.attention.local_blocks}, {"theta", s.attention.theta},
          {"window", cap}, {"diagnose_rows", s.eval.diagnose_rows},
          {"accuracy", {{"dense", acc(0)}, {"sparse", acc(1)}, {"oracle", acc(2)}, {"dense_layer", dense_layer},
                        {"sparse_layer", sparse_layer}}},
          {"layers", layers}};
}

}  // namespace sb
