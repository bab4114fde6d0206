// `sparsebalance simulate`: the balancer on a modelled cluster of N ranks, every policy side by side.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "src/balance/simulate.hpp"
#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "base/error.hpp"
#include "src/train/settings.hpp"

namespace sb {

namespace {

int run_simulate(const Args& args) {
  if (args.positional.size() > 1) throw Error("sparsebalance simulate: expected at most one CONFIG file, got " + std::to_string(args.positional.size()) + " positional arguments");
  Config cfg = Config::load(args.positional.empty() ? "" : args.positional[0], args.sets);
  Comm comm;
  const SimulateSettings ss = simulate_settings(cfg);
  SimConfig sc = ss.sim;

  std::string profile = args.get("profile", ss.profile);
  LatencyModel lm;
  if (!profile.empty()) {
    lm = LatencyModel::load_file(profile);  // the profile's own shape
  } else {
    lm = LatencyModel(ss.shape);
    lm.set_coeffs(Part::Linear, {ss.mb_overhead_ms, ss.linear_us_per_token * 1e-3, 0});
    lm.set_coeffs(Part::Attention, {0, 0, ss.attn_ps_per_pair * 1e-9});
    lm.set_coeffs(Part::Gating, {0, 0, ss.gating_ns_per_pair * 1e-6});
  }
  lm.set_ema(ss.ema);
  lm.set_part_gating(ss.part_gating);  // as the engine of train.device gates documents in parts
  // hybrid layers: costed dense, not tuned (the profile's n_layers, or simulate.n_layers)
  lm.set_dense_layers(parse_dense_layers(ss.dense_layers, lm.shape().n_layers,
                                         profile.empty() ? "simulate.n_layers" : "n_layers of profile " + profile));
  const ModelShape& shape = lm.shape();
  RecallModel rm(shape, ss.recall_alpha, ss.ema);
  const double a0 = ss.alpha_lo, a1 = ss.alpha_hi;
  for (int l = 0; l < shape.n_layers; ++l)
    rm.set_alpha(l, shape.n_layers == 1 ? a0 : a0 + (a1 - a0) * l / (shape.n_layers - 1));
  sc.dst.n_layers = shape.n_layers;

  SimResult res = simulate(sc, lm, rm);
  if (comm.root()) {
    std::printf("simulate: %d ranks x %d micro-batches x %lld tokens (fill %.2f), preset %s, %d steps, seed %llu\n",
                sc.ranks, sc.micro_batches, (long long)sc.capacity, sc.fill, preset_name(sc.preset), sc.steps,
                (unsigned long long)sc.seed);
    std::printf("model: %s, %d layers, Bs %d, w %d, k0 %d (k in [%d, %d]), target %s; attention = %.0f%% of a %lld-token micro-batch\n",
                profile.empty() ? "analytic" : profile.c_str(), shape.n_layers, shape.block_size, shape.local_blocks,
                sc.dst.k0, res.k_lo, budget_steps(sc.dst).back(), target_name(sc.dst.target), 100 * res.attention_share,
                (long long)sc.max_len);
    if (sc.plan.group_ranks > 0 && sc.plan.group_ranks < sc.ranks)
      std::printf("two-level plan: groups of %d ranks (sequential stays one-level); plan_ms counts one rank's group plan\n", sc.plan.group_ranks);
    std::printf("per step: %.0f documents, %.0f segments, %.3g tokens", res.docs_per_step, res.segments_per_step, res.tokens_per_step);
    if (sc.split_long) std::printf(", %.1f documents split", res.split_per_step);
    std::printf("\n");
    if (sc.split_long && res.split_per_step > 0) {  // DST tunes the parts per member, as in train
      const PolicyResult& d = res.policies.back();  // sparse+dst
      std::printf("split parts' budgets under %s: k in [%d, %d]\n", d.name.c_str(), d.part_k_lo, d.part_k_hi);
      const PolicyResult& f = res.policies[res.policies.size() - 2];  // sparse+fixed
      std::printf("%s per rank: mean %.1f ms, of it exchange %.1f ms and parts beyond their documents' cost %.1f ms\n",
                  f.name.c_str(), f.mean_ms, f.exchange_ms, f.split_extra_ms);
    }
    std::printf("\n");
    std::printf("%-22s %12s %9s %7s %8s %8s %8s %10s\n", "policy", "makespan_ms", "imbal", "bubble", "recall", "speedup", "vs_LB", "plan_ms");
    for (const auto& p : res.policies)
      std::printf("%-22s %12.1f %9.4f %7.4f %8.5f %8.3f %8.4f %10.3f\n", p.name.c_str(), p.makespan, p.imbalance, p.bubble,
                  p.recall, p.speedup, p.gap_lb, p.plan_ms);
    std::printf("\nlower bound %.1f ms (budgets at k_lo = %d; at k0: %.1f ms). plan_ms = make_plan + T* + one rank's own\n"
                "items/summary/tuning, i.e. what each real rank pays per step (the other ranks' tuning is simulation overhead).\n",
                res.lower_bound, res.k_lo, res.lower_bound_k0);
    std::printf("token-level bound %.1f ms (total work / ranks), whole-document bound %.1f ms (no plan of whole documents "
                "beats it)\n", res.token_bound, res.whole_doc_bound);
    std::printf("token-level bound at k0 %.1f ms (fixed budgets), with the unavoidable exchange %.1f ms (documents over capacity "
                "on their fewest members)\n", res.token_bound_k0, res.token_bound_k0_exchange);
    if (sc.split_long)
      std::printf("and with those members' gating beyond their share (part_gating_ms) %.1f ms (what split plans can reach)\n",
                  res.token_bound_k0_floor);
  }
  if (args.has("summary") && comm.root()) {
    nlohmann::json j;
    for (const auto& p : res.policies)
      j["policies"][p.name] = {{"makespan", p.makespan}, {"imbalance", p.imbalance}, {"bubble", p.bubble},
                               {"recall", p.recall}, {"speedup", p.speedup}, {"plan_ms", p.plan_ms},
                               {"make_plan_ms", p.make_plan_ms}, {"vs_lower_bound", p.gap_lb},
                               {"part_k_lo", p.part_k_lo}, {"part_k_hi", p.part_k_hi},
                               {"mean_ms", p.mean_ms}, {"part_exchange_ms", p.exchange_ms}, {"part_split_extra_ms", p.split_extra_ms}};
    j["lower_bound"] = res.lower_bound, j["lower_bound_k0"] = res.lower_bound_k0, j["k_lo"] = res.k_lo;
    j["token_bound"] = res.token_bound, j["whole_doc_bound"] = res.whole_doc_bound;
    j["token_bound_k0"] = res.token_bound_k0, j["token_bound_k0_exchange"] = res.token_bound_k0_exchange;
    j["token_bound_k0_floor"] = res.token_bound_k0_floor;
    j["split_per_step"] = res.split_per_step;
    j["ranks"] = sc.ranks, j["micro_batches"] = sc.micro_batches, j["preset"] = preset_name(sc.preset), j["steps"] = sc.steps;
    j["seed"] = sc.seed, j["target"] = target_name(sc.dst.target), j["attention_share"] = res.attention_share;
    j["docs_per_step"] = res.docs_per_step, j["segments_per_step"] = res.segments_per_step;
    write_summary(args.get("summary"), j);
  }
  return 0;
}

}  // namespace

Command cmd_simulate() {
  return {"simulate",
          "the balancer on a modelled cluster: every batching x tuning policy side by side",
          "[CONFIG.toml] [--set simulate.ranks=N] [--set simulate.micro_batches=M] [--set simulate.preset=P]\n"
          "    [--set simulate.steps=S] [--profile FILE.h5] [--summary PATH]\n\n"
          "Draws each step's global batch of documents from a length preset (longalign, chatqa2, uniform,\n"
          "fixed), plans it with batching sequential|tokens|quadratic|sparse and tunes it with fixed|dst for\n"
          "every modelled rank (no MPI traffic), scoring with the latency model (a profile, or analytic\n"
          "constants from the [simulate] keys). Prints makespan, imbalance, bubble, recall, speedup against\n"
          "sequential+fixed, ratio to the lower bound and the per-rank planning time.",
          {{"profile", 1, "latency profile (HDF5) instead of the analytic model (overrides balance.profile)", "FILE"}},
          run_simulate};
}

}  // namespace sb
