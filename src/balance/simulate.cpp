#include "src/balance/simulate.hpp"

#include <algorithm>
#include <ctime>
#include <cmath>

#include "base/error.hpp"

namespace sb {

namespace {

// CPU time of this thread: what planning costs, unaffected by other processes on a shared machine.
double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

struct Acc {
  double makespan = 0, imbalance = 0, bubble = 0, rec = 0, weight = 0, plan_ms = 0, make_plan_ms = 0, gap = 0, planned = 0;
  int part_k_lo = 0, part_k_hi = 0;
  double mean = 0, exchange = 0, extra = 0;
};

// SplitMix64: independent, reproducible noise streams per (seed, step, policy).
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A split part's predicted time with every layer at budget k (DST's costing: build_items with the
// document's length), without its exchange.
double part_cost(const LatencyModel& lm, const RecallModel& rm, const DstParams& p, const MicroBatch& mb, int64_t doc_len, int k) {
  DstParams one = p;
  one.k0 = k, one.max_change = 0, one.k_min = 0, one.k_max = 1 << 20;
  const DstItems it = build_items(std::span<const MicroBatch>(&mb, 1), lm, rm, one, std::span<const int64_t>(&doc_len, 1));
  return item_ms(it, 0, std::vector<int>(size_t(p.n_layers), k));
}

}  // namespace

SplitParts split_parts(std::span<const PartGroup> groups, int ranks, const LatencyModel& lm, int k0, double kv_bytes_per_token,
                       double* member_ms) {
  SplitParts out;
  out.mbs.resize(size_t(ranks)), out.doc_len.resize(size_t(ranks)), out.exchange_ms.resize(size_t(ranks));
  const ModelShape& sh = lm.shape();
  const double tc = token_cost(lm);
  for (const PartGroup& g : groups) {
    const double t0 = member_ms ? now_ms() : 0;
    const auto pieces = split_document(int64_t(g.len), g.ranks, sh.block_size,
                                       block_costs(int64_t(g.len), sh.block_size, true, k0, sh.local_blocks, tc, lm.dense_share()));
    if (member_ms) *member_ms += (now_ms() - t0) * g.ranks;
    const double x = part_exchange_ms(lm, int64_t(g.len), g.ranks, kv_bytes_per_token);
    for (int i = 0; i < g.ranks; ++i) {
      const size_t r = size_t(g.first + i);
      out.mbs[r].push_back(piece_batch(g.doc, pieces[size_t(i)]));
      out.doc_len[r].push_back(int64_t(g.len)), out.exchange_ms[r].push_back(x);
    }
  }
  return out;
}

SimResult simulate(const SimConfig& cfg, const LatencyModel& lm, const RecallModel& rm) {
  if (cfg.ranks < 1 || cfg.micro_batches < 1 || cfg.steps < 1)
    throw Error("simulate: simulate.ranks, simulate.micro_batches and simulate.steps must be >= 1");
  // Planning time and memory grow with the micro-batches of a step (the global batch is ranks x
  // micro_batches x capacity x fill tokens): refused before anything is allocated.
  if (int64_t(cfg.ranks) * cfg.micro_batches > kMaxSimMicroBatches)
    throw Error("simulate.ranks = " + std::to_string(cfg.ranks) + " x simulate.micro_batches = " +
                std::to_string(cfg.micro_batches) + " = " + std::to_string(int64_t(cfg.ranks) * cfg.micro_batches) +
                " micro-batches per step, more than simulate plans (at most " + std::to_string(kMaxSimMicroBatches) +
                ", e.g. 4096 ranks x 16): lower simulate.ranks or simulate.micro_batches");
  const Batching batchings[] = {Batching::Sequential, Batching::Tokens, Batching::Quadratic, Batching::Sparse};
  const Tuning tunings[] = {Tuning::Fixed, Tuning::Dst};
  const int R = cfg.ranks;
  SimResult out;
  int k0i = 0;
  out.k_lo = budget_steps(cfg.dst, &k0i).front();
  {
    MicroBatch one{{Segment{0, 0, uint64_t(cfg.max_len)}}, cfg.max_len};
    auto parts = lm.micro_batch_parts(one, std::vector<int>(size_t(lm.shape().n_layers), cfg.dst.k0));
    out.attention_share = parts.attention / parts.total();
  }
  std::vector<Acc> acc(8);
  LengthSampler sampler(cfg.preset, cfg.max_len, cfg.seed);
  const double target_tokens = double(R) * cfg.micro_batches * double(cfg.capacity) * cfg.fill;
  // the exchange's buffers, reused across policies and steps as a real rank reuses them
  std::vector<double> gathered;
  std::vector<RankSummary> unpacked;
  for (int step = 0; step < cfg.steps; ++step) {
    // The global batch: whole documents until the next one would pass the token target.
    std::vector<std::pair<uint64_t, uint64_t>> docs;
    double tokens = 0;
    for (uint64_t id = 0;; ++id) {
      uint64_t len = sampler.next();
      if (tokens + double(len) > target_tokens && !docs.empty()) break;
      docs.push_back({uint64_t(step) << 40 | id, len}), tokens += double(len);
    }
    double sum_whole = 0, max_whole = 0, whole_k0 = 0, floor_x = 0, floor_g = 0;  // the bounds of whole documents, and of tokens
    for (const auto& [id, len] : docs) {
      const double c = lm.segment_cost(int64_t(len), out.k_lo);
      sum_whole += c, max_whole = std::max(max_whole, c), whole_k0 += lm.segment_cost(int64_t(len), cfg.dst.k0);
      if (cfg.split_long && int64_t(len) > cfg.capacity)  // on ceil(len / capacity) members at least, each exchanging
        if (const int G = int((int64_t(len) + cfg.capacity - 1) / cfg.capacity); G <= R)
          floor_x += G * part_exchange_ms(lm, int64_t(len), G, cfg.kv_bytes_per_token),
              floor_g += (G - 1) * part_gating_ms(lm, int64_t(len));
    }
    out.token_bound += sum_whole / R / cfg.steps;
    out.token_bound_k0 += whole_k0 / R / cfg.steps;
    out.token_bound_k0_exchange += (whole_k0 + floor_x) / R / cfg.steps;
    out.token_bound_k0_floor += (whole_k0 + floor_x + floor_g) / R / cfg.steps;
    out.whole_doc_bound += std::max(sum_whole / R, max_whole) / cfg.steps;
    // Splitting: the long documents leave the plan; their groups are placed per batching below.
    std::vector<std::pair<uint64_t, uint64_t>> short_docs = docs;
    double part_sum_lo = 0, part_max_lo = 0, part_sum_k0 = 0, part_max_k0 = 0;
    if (cfg.split_long) {
      std::vector<double> ignored;
      const auto groups = place_long_docs(short_docs, cfg.capacity, R, Batching::Tokens, lm, cfg.dst.k0, cfg.kv_bytes_per_token,
                                          cfg.split_docs, ignored, cfg.part_share);
      const SplitParts sp = split_parts(groups, R, lm, cfg.dst.k0, cfg.kv_bytes_per_token);
      for (int r = 0; r < R; ++r)  // each member's part as DST costs it (its rows of the whole document), plus the exchange
        for (size_t i = 0; i < sp.mbs[size_t(r)].size(); ++i) {
          const MicroBatch& mb = sp.mbs[size_t(r)][i];
          const int64_t n = sp.doc_len[size_t(r)][i];
          const double x = sp.exchange_ms[size_t(r)][i];
          const double lo = part_cost(lm, rm, cfg.dst, mb, n, out.k_lo) + x, at_k0 = part_cost(lm, rm, cfg.dst, mb, n, cfg.dst.k0) + x;
          part_sum_lo += lo, part_max_lo = std::max(part_max_lo, lo);
          part_sum_k0 += at_k0, part_max_k0 = std::max(part_max_k0, at_k0);
        }
      out.split_per_step += double(groups.size()) / cfg.steps;
    }
    auto segs = make_segments(short_docs, cfg.capacity, cfg.reject_long);
    out.docs_per_step += double(docs.size()) / cfg.steps;
    out.segments_per_step += double(segs.size()) / cfg.steps;
    out.tokens_per_step += tokens / cfg.steps;
    double sum_lo = 0, max_lo = 0, sum_k0 = 0, max_k0 = 0;
    for (const auto& s : segs) {
      double c = lm.segment_cost(int64_t(s.len), out.k_lo), c0 = lm.segment_cost(int64_t(s.len), cfg.dst.k0);
      sum_lo += c, max_lo = std::max(max_lo, c), sum_k0 += c0, max_k0 = std::max(max_k0, c0);
    }
    double lb = std::max((sum_lo + part_sum_lo) / R, std::max(max_lo, part_max_lo));
    out.lower_bound += lb / cfg.steps;
    out.lower_bound_k0 += std::max((sum_k0 + part_sum_k0) / R, std::max(max_k0, part_max_k0)) / cfg.steps;

    for (int bi = 0; bi < 4; ++bi) {
      double t0 = now_ms();
      // The split documents' groups, placed in this batching's cost units, are the plan's preload.
      // The cuts of the groups' documents: each rank cuts its own (the trainer's plan step), planning time too.
      std::vector<double> preload;
      std::vector<PartGroup> groups;
      if (cfg.split_long) {
        std::vector<std::pair<uint64_t, uint64_t>> rest = docs;
        groups = place_long_docs(rest, cfg.capacity, R, batchings[bi], lm, cfg.dst.k0, cfg.kv_bytes_per_token, cfg.split_docs,
                                 preload, cfg.part_share);
      }
      Plan plan = make_plan(segs, R, cfg.micro_batches, cfg.capacity, batchings[bi], lm, cfg.dst.k0, cfg.plan, preload);
      double plan_ms = now_ms() - t0, cut_ms = 0;
      const SplitParts parts = split_parts(groups, R, lm, cfg.dst.k0, cfg.kv_bytes_per_token, &cut_ms);
      plan_ms += cut_ms / R;
      double whole_split = 0;  // the split documents' whole cost at k0
      for (const PartGroup& g : groups) whole_split += lm.segment_cost(int64_t(g.len), cfg.dst.k0);
      if (cfg.plan.group_ranks > 0 && cfg.plan.group_ranks < R && batchings[bi] != Batching::Sequential) {
        // Two-level plan: one real rank computes only its group's part (tested equal to the plan's).
        const int me = int((uint64_t(step) * 7919u) % uint64_t(R));
        t0 = now_ms();
        GroupPlan mine = make_group_plan(segs, R, cfg.micro_batches, cfg.capacity, batchings[bi], lm, cfg.dst.k0, cfg.plan, me);
        plan_ms = now_ms() - t0;
      }
      for (int ti = 0; ti < 2; ++ti) {
        DstParams p = cfg.dst;
        p.tuning = tunings[ti];
        // Every modelled rank: its items and summary (what each real rank computes for itself).
        double t1 = now_ms();
        // A rank's split parts follow its planned micro-batches, costed as the trainer costs them.
        std::vector<DstItems> items(static_cast<size_t>(R));
        std::vector<RankSummary> sums(static_cast<size_t>(R));
        std::vector<MicroBatch> mine;
        std::vector<int64_t> doc_len;
        std::vector<double> extra;
        for (int r = 0; r < R; ++r) {
          const auto& planned = plan.ranks[size_t(r)];
          mine.assign(planned.begin(), planned.end());
          mine.insert(mine.end(), parts.mbs[size_t(r)].begin(), parts.mbs[size_t(r)].end());
          doc_len.assign(planned.size(), 0);
          doc_len.insert(doc_len.end(), parts.doc_len[size_t(r)].begin(), parts.doc_len[size_t(r)].end());
          extra.assign(planned.size(), 0.0);
          extra.insert(extra.end(), parts.exchange_ms[size_t(r)].begin(), parts.exchange_ms[size_t(r)].end());
          items[size_t(r)] = build_items(mine, lm, rm, p, doc_len, extra);
          sums[size_t(r)] = summarize(items[size_t(r)], p);
        }
        double own_ms = (now_ms() - t1) / R;
        // The exchange as a real rank sees it: every summary packed (the Allgather's buffer), then
        // all of them unpacked, into summaries kept from the step before as `train` keeps them.
        const size_t n = packed_size(p);
        gathered.resize(n * size_t(R));
        for (int r = 0; r < R; ++r) {
          const std::vector<double> v = pack(sums[size_t(r)], p);
          std::copy(v.begin(), v.end(), gathered.begin() + std::ptrdiff_t(n * size_t(r)));
        }
        unpacked.resize(size_t(R));
        double tu = now_ms();
        for (int r = 0; r < R; ++r) unpack(std::span<const double>(gathered.data() + n * size_t(r), n), unpacked[size_t(r)]);
        double unpack_ms = now_ms() - tu;
        double t2 = now_ms();
        double T = target_time(unpacked, p);  // every real rank computes this same value
        double target_ms = now_ms() - t2 + unpack_ms;
        double t3 = now_ms();
        std::vector<TuneResult> res(static_cast<size_t>(R));
        for (int r = 0; r < R; ++r) res[size_t(r)] = tune_rank(items[size_t(r)], T, p);
        double tune_ms = (now_ms() - t3) / R;
        // Score: the latency model is the truth (optionally with per-micro-batch noise).
        uint64_t noise_state = splitmix(cfg.seed ^ splitmix(uint64_t(step) * 8 + uint64_t(bi * 2 + ti)));
        std::vector<double> t(size_t(R), 0.0);
        double rec = 0, weight = 0, planned_max = 0, planned_sum = 0;
        auto& a = acc[size_t(bi * 2 + ti)];
        for (int r = 0; r < R; ++r) {
          const auto& it = items[size_t(r)];
          const size_t n_planned = plan.ranks[size_t(r)].size();
          for (int m = 0; m < it.n_mb; ++m) {
            const auto& k = res[size_t(r)].k[size_t(m)];
            double ms = 0;
            if (size_t(m) < n_planned) {
              ms = lm.micro_batch_ms(plan.ranks[size_t(r)][size_t(m)], k);
            } else {  // a split part: its rows of the whole document at its budgets, then the exchange
              const double x = parts.exchange_ms[size_t(r)][size_t(m) - n_planned];
              ms = item_ms(it, m, k);  // the exchange included
              a.exchange += x / R / cfg.steps, a.extra += (ms - x) / R / cfg.steps;
              for (int kl : k) {
                a.part_k_lo = a.part_k_lo ? std::min(a.part_k_lo, kl) : kl;
                a.part_k_hi = std::max(a.part_k_hi, kl);
              }
            }
            if (cfg.noise > 0) {
              noise_state = splitmix(noise_state);
              ms *= 1 + cfg.noise * (2 * (double(noise_state >> 11) * 0x1.0p-53) - 1);
            }
            t[size_t(r)] += ms;
          }
          rec += res[size_t(r)].my_recall * res[size_t(r)].my_weight, weight += res[size_t(r)].my_weight;
          planned_max = std::max(planned_max, res[size_t(r)].my_predicted_ms), planned_sum += res[size_t(r)].my_predicted_ms;
        }
        double mk = *std::max_element(t.begin(), t.end()), sum = 0;
        for (double x : t) sum += x;
        a.mean += sum / R / cfg.steps, a.extra -= whole_split / R / cfg.steps;
        a.makespan += mk, a.imbalance += mk / (sum / R), a.bubble += (R * mk - sum) / (R * mk);
        a.rec += rec, a.weight += weight;
        a.plan_ms += plan_ms + own_ms + target_ms + tune_ms, a.make_plan_ms += plan_ms;
        a.gap += mk / lb, a.planned += planned_sum > 0 ? planned_max / (planned_sum / R) : 1;
      }
    }
  }
  for (int bi = 0; bi < 4; ++bi)
    for (int ti = 0; ti < 2; ++ti) {
      const auto& a = acc[size_t(bi * 2 + ti)];
      PolicyResult pr;
      pr.name = std::string(batching_name(batchings[bi])) + "+" + tuning_name(tunings[ti]);
      double S = cfg.steps;
      pr.makespan = a.makespan / S, pr.imbalance = a.imbalance / S, pr.bubble = a.bubble / S;
      pr.recall = a.weight > 0 ? a.rec / a.weight : 1.0;
      pr.plan_ms = a.plan_ms / S, pr.make_plan_ms = a.make_plan_ms / S, pr.gap_lb = a.gap / S, pr.planned_imbalance = a.planned / S;
      pr.part_k_lo = a.part_k_lo, pr.part_k_hi = a.part_k_hi;
      pr.mean_ms = a.mean, pr.exchange_ms = a.exchange, pr.split_extra_ms = a.extra;
      out.policies.push_back(pr);
    }
  for (auto& pr : out.policies) pr.speedup = out.policies[0].makespan / pr.makespan;
  return out;
}

}  // namespace sb
