#include "src/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>

#include "io/checkpoint.hpp"
#include "src/train/evaluate.hpp"
#include "src/train/faults.hpp"
#include "src/train/profile.hpp"
#include "src/common/error.hpp"

namespace sb {

std::atomic<int> g_stop_signal{0};

using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Per-rank values every rank contributes to the step's one stats all-reduce (its own slots),
// so every rank ends the step with every rank's measurements and updates its models identically.
enum RankSlot {
  kCompute, kIdle, kPredicted, kMicroBatches, kTokens, kBudgetSum, kBudgetN, kBudgetMin, kBudgetMax,
  kKept, kCausal, kRecallSum, kRows, kAttnMs, kGatingMs, kPredAttn, kPredGating, kPredLinear,
  kCandPred, kCandMeas, kAbove, kBelow, kStepMs, kStop, kRankSlots
};
// Global sums after the rank slots: loss, correct predictions, then per layer (kept, causal, recall, rows).
enum GlobalSlot { kLossSum, kCorrect, kGlobalSlots };

struct Trainer::StepOut {
  StepRow row{};
  std::vector<RankRow> ranks;
  int64_t above = 0, below = 0;
  bool stop = false;
};

Trainer::Trainer(const Config& cfg, const Comm& comm, const std::string& resume, int64_t stop_at)
    : cfg_(cfg),
      comm_(comm),
      ds_(Dataset::open(cfg.s("data.path"))),
      dims_(ModelDims::from_config(cfg, ds_.vocab_size())),
      model_(dims_),
      os_(OptimSettings::from_config(cfg)),
      opt_(os_, model_.weights().size()),
      lm_(ModelShape{dims_.n_layers, int(cfg.i("attention.block_size")), int(cfg.i("attention.local_blocks"))}),
      rm_(ModelShape{dims_.n_layers, int(cfg.i("attention.block_size")), int(cfg.i("attention.local_blocks"))},
          cfg.f("balance.recall_alpha"), cfg.f("balance.ema")),
      batching_(parse_batching(cfg.s("balance.batching"))),
      engine_(make_engine(cfg, comm, model_, opt_)),
      faults_(cfg),
      stop_at_(stop_at) {
  if (!cfg.s("balance.profile").empty())
    lm_ = LatencyModel::load_file(cfg.s("balance.profile"), &lm_.shape());
  lm_.set_ema(cfg.f("balance.ema"));
  plan_opt_.swap_rounds = int(cfg.i("balance.swap_rounds"));
  plan_opt_.group_ranks = int(cfg.i("balance.group_ranks"));
  dst_.k0 = int(cfg.i("attention.k"));
  dst_.k_min = int(cfg.i("balance.k_min"));
  dst_.k_max = int(cfg.i("balance.k_max"));
  dst_.max_change = cfg.f("balance.max_change");
  dst_.target = parse_target(cfg.s("balance.target"));
  dst_.tuning = parse_tuning(cfg.s("balance.tuning"));
  dst_.n_layers = dims_.n_layers;
  attn_.sparse = cfg.s("attention.mode") == "sparse";
  attn_.block_size = int(cfg.i("attention.block_size"));
  attn_.local_blocks = int(cfg.i("attention.local_blocks"));
  attn_.theta = cfg.f("attention.theta");
  if (!attn_.sparse && dst_.tuning == Tuning::Dst)
    throw Error("balance.tuning = \"dst\" needs attention.mode = \"sparse\" (dense attention has no budget to tune)");

  model_.init(uint64_t(cfg.i("train.seed")));
  const bool resumed = restore(resume);  // src/train/resume.cpp
  if (!resumed && cfg.s("balance.profile").empty() && cfg.b("balance.self_profile")) {
    // On train.device (its own engine, weights and activations, freed before training starts).
    ProfileReport pr = profile_machine(cfg, comm, dims_.vocab, /*quick=*/true);
    lm_ = pr.model;
    lm_.set_ema(cfg.f("balance.ema"));
    if (comm.root())
      std::printf("latency model: quick self-profile, %d samples in %.1f s (attention held-out error %.0f%%)\n",
                  pr.samples, pr.seconds, 100 * pr.attention.heldout_error);
  }
  engine_->from_host();  // the initial or restored weights and moments
  if (comm.root()) {
    std::vector<std::string> inputs;
    for (const auto& sh : ds_.shards()) inputs.push_back(sh.path());
    const std::string& lp = cfg.s("log.path");
    const std::string copy = archive_.empty() ? "" : (std::filesystem::path(archive_) / std::filesystem::path(lp).filename()).string();
    log_ = open_metrics_log(lp, comm.size(), resumed, start_step_, copy, inputs);
  }
}

void Trainer::save_checkpoint(int64_t s) {
  faults_.at(Faults::Phase::Checkpoint, s, comm_.rank());
  std::string path = checkpoint_path(cfg_.s("checkpoint.dir"), s);
  std::string err;
  if (comm_.root()) {
    Checkpoint ck;
    ck.step = s;
    ck.ranks = comm_.size();
    ck.config_toml = cfg_.to_toml();
    ck.data_epoch = cur_.epoch;
    ck.data_cursor = cur_.index;
    ck.skipped_steps = skipped_;
    for (const auto& p : model_.params()) ck.tensors.push_back({p.name, p.shape, p.offset, p.size});
    engine_->to_host();
    ck.params = model_.weights();
    ck.m = opt_.m();
    ck.v = opt_.v();
    try {
      write_checkpoint(path, ck, [&](hid_t f) {
        h5::Id g = h5::group(f, "latency", true);
        lm_.save(g);
        std::vector<double> alphas;
        for (int l = 0; l < dims_.n_layers; ++l) alphas.push_back(rm_.alpha(l));
        h5::write_vector(f, "recall/alpha", alphas);
      });
      prune_checkpoints(cfg_.s("checkpoint.dir"), cfg_.i("checkpoint.keep"));
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  comm_.broadcast(err);  // every rank learns the outcome, so all stop or all go on
  if (err.empty()) {
    last_checkpoint_ = path;
    return;
  }
  if (cfg_.s("checkpoint.on_error") == "stop") throw Error(err + " (checkpoint.on_error = \"stop\")");
  if (comm_.root()) std::fprintf(stderr, "warning: %s; training continues (checkpoint.on_error = \"continue\")\n", err.c_str());
}

Trainer::StepOut Trainer::step(int64_t s) {
  const int R = comm_.size(), me = comm_.rank(), L = dims_.n_layers;
  const int64_t cap = cfg_.i("train.micro_batch_tokens");
  const auto t_step = Clock::now();

  faults_.at(Faults::Phase::Plan, s, me);
  // ---- plan: the global batch and its split over ranks x micro-batches (same on every rank)
  GlobalBatch gb = draw_global_batch(ds_, uint64_t(cfg_.i("data.seed")), cfg_.f("data.val_fraction"),
                                     cfg_.i("train.global_batch_tokens"), cur_, order_);
  std::vector<Segment> segs = make_segments(gb.docs, cap, cfg_.s("data.long_docs") == "reject");
  const int M = int(std::max<int64_t>(1, (gb.tokens + int64_t(R) * cap - 1) / (int64_t(R) * cap)));
  // One plan over all ranks, or (balance.group_ranks) only this rank's group's plan: the same
  // micro-batches as the whole two-level plan would give this rank, at a fraction of the cost.
  std::vector<MicroBatch> mine;
  if (plan_opt_.group_ranks > 0 && plan_opt_.group_ranks < R && batching_ != Batching::Sequential) {
    GroupPlan gp = make_group_plan(segs, R, M, cap, batching_, lm_, dst_.k0, plan_opt_, me);
    mine = std::move(gp.ranks[size_t(me - gp.first_rank)]);
  } else {
    Plan plan = make_plan(segs, R, M, cap, batching_, lm_, dst_.k0, plan_opt_);
    mine = std::move(plan.ranks[size_t(me)]);
  }
  const int64_t global_targets = count_targets(segs);
  // ---- predict, exchange (one collective), tune
  faults_.at(Faults::Phase::Predict, s, me);
  faults_.at(Faults::Phase::Exchange, s, me);
  TuneResult tr = exchange_and_tune(comm_, mine, lm_, rm_, dst_, dst_work_);
  faults_.at(Faults::Phase::Tune, s, me);  // tuning ends inside exchange_and_tune, after its collective
  const double plan_ms = ms_since(t_step);

  // ---- compute
  faults_.at(Faults::Phase::Compute, s, me);
  std::vector<double> slots(size_t(R) * kRankSlots + kGlobalSlots + 4 * size_t(L), 0.0);
  double* my = slots.data() + size_t(me) * kRankSlots;
  double* glob = slots.data() + size_t(R) * kRankSlots;
  double* layer = glob + kGlobalSlots;
  my[kBudgetMin] = 1e300, my[kBudgetMax] = -1e300;
  engine_->zero_grads();
  const auto t_compute = Clock::now();
  for (size_t m = 0; m < mine.size(); ++m) {
    PackedBatch b = pack_micro_batch(ds_, mine[m]);
    attn_.k = tr.k[m];
    MicroBatchStats st = engine_->forward_backward(b, attn_, float(1.0 / double(std::max<int64_t>(global_targets, 1))),
                                                   m + 1 == mine.size());
    PartTimes pred = lm_.micro_batch_parts(mine[m], tr.k[m]);
    my[kPredAttn] += pred.attention, my[kPredGating] += pred.gating, my[kPredLinear] += pred.linear;
    my[kAttnMs] += st.attn_ms, my[kGatingMs] += st.gating_ms;
    my[kTokens] += double(b.n());
    glob[kLossSum] += st.loss_sum, glob[kCorrect] += double(st.correct);
    for (int l = 0; l < L; ++l) {
      const auto& g = st.gating[size_t(l)];
      int k = tr.k[m][size_t(l)];
      my[kBudgetSum] += k, my[kBudgetN] += 1;
      my[kBudgetMin] = std::min(my[kBudgetMin], double(k)), my[kBudgetMax] = std::max(my[kBudgetMax], double(k));
      my[kAbove] += k > dst_.k0, my[kBelow] += k < dst_.k0;
      my[kKept] += g.kept_blocks, my[kCausal] += g.causal_blocks, my[kRecallSum] += g.recall_sum, my[kRows] += g.rows;
      layer[4 * l + 0] += g.kept_blocks, layer[4 * l + 1] += g.causal_blocks;
      layer[4 * l + 2] += g.recall_sum, layer[4 * l + 3] += g.rows;
      if (attn_.sparse) {  // what the budget allowed vs what survived theta (per kv head)
        double anchors = 0, allowed = 0;
        for (const auto& sg : mine[m].segs) {
          anchors += lm_.anchor_blocks(int64_t(sg.len));
          allowed += (lm_.kept_blocks(int64_t(sg.len), k) - lm_.anchor_blocks(int64_t(sg.len))) / lm_.density();
        }
        my[kCandPred] += allowed, my[kCandMeas] += g.kept_blocks / dims_.n_kv_heads - anchors;
      }
    }
  }
  my[kCompute] = ms_since(t_compute);
  my[kPredicted] = tr.my_predicted_ms;
  my[kMicroBatches] = double(mine.size());
  if (my[kBudgetN] == 0) my[kBudgetMin] = my[kBudgetMax] = 0;
  my[kStop] = (g_stop_signal.load() != 0 || (stop_at_ > 0 && s >= stop_at_)) ? 1 : 0;

  // ---- reduce: the wait for the slowest rank is the bubble; then gradients and stats
  faults_.at(Faults::Phase::Reduce, s, me);
  const auto t_idle = Clock::now();
  comm_.barrier();
  my[kIdle] = ms_since(t_idle);
  // Fault injection, a testing aid (train.inject_nan_step/_count): rank 0 poisons its loss and one
  // gradient before the reduction, so every rank sees the non-finite values, as with a real overflow.
  if (const int64_t inj = cfg_.i("train.inject_nan_step");
      inj > 0 && s >= inj && s < inj + cfg_.i("train.inject_nan_count") && me == 0) {
    glob[kLossSum] = std::numeric_limits<double>::quiet_NaN();
    engine_->poison_gradient();
  }
  engine_->reduce_gradients();
  my[kStepMs] = ms_since(t_step);
  comm_.allreduce_sum_inplace(slots);

  // ---- update
  faults_.at(Faults::Phase::Update, s, me);
  StepOut out;
  const double loss = glob[kLossSum] / double(std::max<int64_t>(global_targets, 1));
  const double gnorm = engine_->gradient_norm();
  const double lr = lr_at(os_, s);
  const bool finite = std::isfinite(loss) && std::isfinite(gnorm);
  if (finite) {
    engine_->update(gnorm, lr, s);
    skipped_ = 0;
  } else {
    ++skipped_;
    if (cfg_.s("train.nonfinite") == "stop")
      throw Error("step " + std::to_string(s) + ": non-finite loss or gradient (train.nonfinite = \"stop\"); the last "
                  "checkpoint is " + (last_checkpoint_.empty() ? std::string("none") : last_checkpoint_));
    if (skipped_ > cfg_.i("train.max_skips"))
      throw Error("step " + std::to_string(s) + ": " + std::to_string(skipped_) +
                  " consecutive non-finite steps skipped, more than train.max_skips = " +
                  std::to_string(cfg_.i("train.max_skips")));
    if (comm_.root()) std::fprintf(stderr, "warning: step %lld skipped: non-finite loss or gradient\n", static_cast<long long>(s));
  }

  const int64_t sync_every = cfg_.i("train.sync_check_every");
  if (sync_every > 0 && s % sync_every == 0 &&
      !comm_.all_equal(engine_->weights_hash()))
    throw Error("step " + std::to_string(s) + ": ranks hold different parameters after the update (the all-reduce "
                "or the update is not deterministic); stopping before the divergence spreads");

  // ---- measure: every rank updates its latency and recall models from the same sums
  faults_.at(Faults::Phase::Measure, s, me);
  double sum[kRankSlots] = {0};
  double max_compute = 0, max_step = 0;
  for (int r = 0; r < R; ++r) {
    const double* x = slots.data() + size_t(r) * kRankSlots;
    for (int i = 0; i < kRankSlots; ++i) sum[i] += x[i];
    max_compute = std::max(max_compute, x[kCompute]);
    max_step = std::max(max_step, x[kStepMs]);
  }
  lm_.observe(Part::Attention, sum[kPredAttn], sum[kAttnMs]);
  if (attn_.sparse) lm_.observe(Part::Gating, sum[kPredGating], sum[kGatingMs]);
  lm_.observe(Part::Linear, sum[kPredLinear], std::max(1e-6, sum[kCompute] - sum[kAttnMs] - sum[kGatingMs]));
  if (attn_.sparse && sum[kCandPred] > 0) lm_.observe_density(sum[kCandPred], sum[kCandMeas]);
  for (int l = 0; l < L && attn_.sparse; ++l)
    if (layer[4 * l + 1] > 0 && layer[4 * l + 3] > 0)
      rm_.observe(l, layer[4 * l + 0] / layer[4 * l + 1], layer[4 * l + 2] / layer[4 * l + 3]);

  // ---- record (rows; the log and checkpoint are written by run())
  faults_.at(Faults::Phase::Record, s, me);
  double pred_err = 0;
  for (int r = 0; r < R; ++r) {
    const double* x = slots.data() + size_t(r) * kRankSlots;
    RankRow rr{};
    rr.step = s, rr.rank = r, rr.micro_batches = int32_t(x[kMicroBatches]), rr.tokens = int64_t(x[kTokens]);
    rr.compute_ms = x[kCompute], rr.idle_ms = x[kIdle], rr.predicted_ms = x[kPredicted];
    rr.mean_budget = x[kBudgetN] > 0 ? x[kBudgetSum] / x[kBudgetN] : 0;
    rr.min_budget = x[kBudgetMin], rr.max_budget = x[kBudgetMax];
    rr.density = x[kCausal] > 0 ? x[kKept] / x[kCausal] : 1;
    rr.recall = x[kRows] > 0 ? x[kRecallSum] / x[kRows] : 1;
    if (x[kCompute] > 0) pred_err += std::abs(x[kPredicted] - x[kCompute]) / x[kCompute] / R;
    out.ranks.push_back(rr);
  }
  StepRow& row = out.row;
  row.step = s, row.loss = loss, row.grad_norm = gnorm, row.lr = lr, row.tokens = gb.tokens;
  row.makespan_ms = max_step;
  row.tokens_per_s = max_step > 0 ? double(gb.tokens) / (max_step / 1000.0) : 0;
  row.imbalance = sum[kCompute] > 0 ? max_compute / (sum[kCompute] / R) : 1;
  row.bubble = max_step > 0 ? sum[kIdle] / (R * max_step) : 0;
  row.density = sum[kCausal] > 0 ? sum[kKept] / sum[kCausal] : 1;
  row.recall = sum[kRows] > 0 ? sum[kRecallSum] / sum[kRows] : 1;
  row.plan_ms = plan_ms;
  row.pred_error = pred_err;
  row.skipped = finite ? 0 : 1;
  out.above = int64_t(sum[kAbove]), out.below = int64_t(sum[kBelow]);
  out.stop = sum[kStop] > 0;
  return out;
}

TrainResult Trainer::run() {
  TrainResult res;
  res.log = cfg_.s("log.path");
  const int64_t total = cfg_.i("train.steps"), every = cfg_.i("checkpoint.every");
  const bool progress = cfg_.b("log.progress") && comm_.root();
  res.first_step = start_step_ + 1;
  double sum_tokens = 0, sum_ms = 0;
  int64_t n = 0;
  for (int64_t s = start_step_ + 1; s <= total; ++s) {
    StepOut o = step(s);
    if (log_) {
      log_->append(o.row, o.ranks);
      if (s % cfg_.i("log.every") == 0 || s == total || o.stop) log_->flush();
    }
    if (progress)
      std::printf("step %5lld/%lld | loss %.4f | gnorm %.3f | lr %.2e | %7.1f ms | %8.0f tok/s | imb %.2f | dens %.2f | rec %.3f\n",
                  static_cast<long long>(s), static_cast<long long>(total), o.row.loss, o.row.grad_norm, o.row.lr,
                  o.row.makespan_ms, o.row.tokens_per_s, o.row.imbalance, o.row.density, o.row.recall),
          std::fflush(stdout);
    if (n == 0) res.first_loss = o.row.loss;
    res.last_loss = o.row.loss;
    res.losses.push_back(o.row.loss);
    res.step_ms.push_back(o.row.makespan_ms);
    res.last_step = s;
    ++n;
    sum_tokens += double(o.row.tokens), sum_ms += o.row.makespan_ms;
    res.mean_imbalance += o.row.imbalance, res.mean_bubble += o.row.bubble;
    res.mean_density += o.row.density, res.mean_recall += o.row.recall, res.mean_pred_error += o.row.pred_error;
    res.budgets_above_k0 += o.above, res.budgets_below_k0 += o.below;
    const bool last = s == total || o.stop;
    if (last || (every > 0 && s % every == 0)) {
      if (log_) log_->flush();  // the log holds every step a checkpoint covers: a kill after it loses no row
      save_checkpoint(s);
    }
    if (o.stop && s < total) {
      res.stopped_early = true;
      if (comm_.root()) std::printf("stopping after step %lld as asked; checkpoint %s\n", static_cast<long long>(s), last_checkpoint_.c_str());
      break;
    }
  }
  if (n > 0) {
    res.tokens_per_s = sum_ms > 0 ? sum_tokens / (sum_ms / 1000.0) : 0;
    res.mean_step_ms = sum_ms / double(n);
    for (double* x : {&res.mean_imbalance, &res.mean_bubble, &res.mean_density, &res.mean_recall, &res.mean_pred_error})
      *x /= double(n);
  }
  if (log_) log_->flush();
  engine_->to_host();  // model() holds the trained weights
  res.checkpoint = last_checkpoint_;
  return res;
}

}  // namespace sb
