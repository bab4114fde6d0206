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
};

// SplitMix64: independent, reproducible noise streams per (seed, step, policy).
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

SimResult simulate(const SimConfig& cfg, const LatencyModel& lm, const RecallModel& rm) {
  if (cfg.ranks < 1 || cfg.micro_batches < 1 || cfg.steps < 1)
    throw Error("simulate: simulate.ranks, simulate.micro_batches and simulate.steps must be >= 1");
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
    double sum_whole = 0, max_whole = 0, whole_k0 = 0, floor_x = 0;  // the bounds of whole documents, and of tokens
    for (const auto& [id, len] : docs) {
      const double c = lm.segment_cost(int64_t(len), out.k_lo);
      sum_whole += c, max_whole = std::max(max_whole, c), whole_k0 += lm.segment_cost(int64_t(len), cfg.dst.k0);
      if (cfg.shard_long && int64_t(len) > cfg.capacity)  // on ceil(len / capacity) members at least, each exchanging
        floor_x += double((int64_t(len) + cfg.capacity - 1) / cfg.capacity) * shard_exchange_ms(lm, int64_t(len), cfg.kv_bytes_per_token);
    }
    out.token_bound += sum_whole / R / cfg.steps;
    out.token_bound_k0 += whole_k0 / R / cfg.steps;
    out.token_bound_k0_exchange += (whole_k0 + floor_x) / R / cfg.steps;
    out.whole_doc_bound += std::max(sum_whole / R, max_whole) / cfg.steps;
    // Sharding: the long documents leave the plan; their groups are placed per batching below.
    std::vector<std::pair<uint64_t, uint64_t>> short_docs = docs;
    double shard_sum_lo = 0, shard_max_lo = 0, shard_sum_k0 = 0, shard_max_k0 = 0;
    if (cfg.shard_long) {
      std::vector<double> ignored;
      for (const ShardGroup& g : place_long_docs(short_docs, cfg.capacity, R, Batching::Tokens, lm, cfg.dst.k0,
                                                 cfg.kv_bytes_per_token, cfg.shard_docs, ignored, cfg.shard_part)) {
        const double lo = lm.segment_cost(int64_t(g.len), out.k_lo) / g.ranks +
                          shard_exchange_ms(lm, int64_t(g.len), cfg.kv_bytes_per_token);
        const double at_k0 = lm.segment_cost(int64_t(g.len), cfg.dst.k0) / g.ranks +
                             shard_exchange_ms(lm, int64_t(g.len), cfg.kv_bytes_per_token);
        shard_sum_lo += lo * g.ranks, shard_max_lo = std::max(shard_max_lo, lo);
        shard_sum_k0 += at_k0 * g.ranks, shard_max_k0 = std::max(shard_max_k0, at_k0);
        out.sharded_per_step += 1.0 / cfg.steps;
      }
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
    double lb = std::max((sum_lo + shard_sum_lo) / R, std::max(max_lo, shard_max_lo));
    out.lower_bound += lb / cfg.steps;
    out.lower_bound_k0 += std::max((sum_k0 + shard_sum_k0) / R, std::max(max_k0, shard_max_k0)) / cfg.steps;

    for (int bi = 0; bi < 4; ++bi) {
      double t0 = now_ms();
      // The sharded documents' groups, placed in this batching's cost units, are the plan's preload.
      std::vector<double> preload, shard_t(size_t(R), 0.0);  // shard_t: their true time per rank
      if (cfg.shard_long) {
        std::vector<std::pair<uint64_t, uint64_t>> rest = docs;
        for (const ShardGroup& g : place_long_docs(rest, cfg.capacity, R, batchings[bi], lm, cfg.dst.k0,
                                                   cfg.kv_bytes_per_token, cfg.shard_docs, preload, cfg.shard_part)) {
          const double ms = lm.segment_cost(int64_t(g.len), cfg.dst.k0) / g.ranks +
                            shard_exchange_ms(lm, int64_t(g.len), cfg.kv_bytes_per_token);
          for (int r = g.first; r < g.first + g.ranks; ++r) shard_t[size_t(r)] += ms;
        }
      }
      Plan plan = make_plan(segs, R, cfg.micro_batches, cfg.capacity, batchings[bi], lm, cfg.dst.k0, cfg.plan, preload);
      double plan_ms = now_ms() - t0;
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
        std::vector<DstItems> items(static_cast<size_t>(R));
        std::vector<RankSummary> sums(static_cast<size_t>(R));
        for (int r = 0; r < R; ++r) {
          items[size_t(r)] = build_items(plan.ranks[size_t(r)], lm, rm, p);
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
        std::vector<double> t = shard_t;  // sharded documents at k0 (DST tunes the planned micro-batches only)
        double rec = 0, weight = 0, planned_max = 0, planned_sum = 0;
        for (int r = 0; r < R; ++r) {
          const auto& it = items[size_t(r)];
          for (int m = 0; m < it.n_mb; ++m) {
            double ms = lm.micro_batch_ms(plan.ranks[size_t(r)][size_t(m)], res[size_t(r)].k[size_t(m)]);
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
        auto& a = acc[size_t(bi * 2 + ti)];
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
      out.policies.push_back(pr);
    }
  for (auto& pr : out.policies) pr.speedup = out.policies[0].makespan / pr.makespan;
  return out;
}

}  // namespace sb
