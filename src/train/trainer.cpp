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
#include "io/file_checksum.hpp"
#include "kernels/lora_dropout.hpp"
#include "base/error.hpp"
#include "src/parts/step_batches.hpp"
#include "src/train/batch_log.hpp"
#include "src/train/faults.hpp"
#include "src/train/profile.hpp"
#include "src/stats/step_stats.hpp"

namespace sb {

std::atomic<int> g_stop_signal{0};

using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Trainer::StepOut {
  StepRow row{};
  std::vector<RankRow> ranks;
  std::vector<SourceRow> sources;  // data.sources: the global batch's draws per source
  int64_t above = 0, below = 0;
  bool stop = false;
};

struct Trainer::StepState {
  int64_t s = 0;                   // the step, from 1
  Clock::time_point t0;            // its start
  GlobalBatch gb;                  // plan
  std::vector<Segment> segs;
  int64_t targets = 0;             // over the global batch
  std::vector<MicroBatch> mine;    // this rank's micro-batches: the plan's, then its documents in parts'
  std::vector<DocPart> parts;    // mine[planned + i] is this rank's part of parts[i] (data.long_docs = "split")
  size_t planned = 0;
  std::vector<double> exchange_ms;  // [micro-batch] a part's K/V exchange (DST's prediction), 0 for planned ones
  std::vector<double> summary;     // predict: this rank's packed RankSummary
  TuneResult tuned;                // tune: per micro-batch budgets, consumed by compute
  double plan_ms = 0;              // plan to tune
  StepStats stats;                 // compute, reduce
  double loss = 0, gnorm = 0, lr = 0;
  bool finite = true;              // update
  StepState(int64_t step, int ranks, int layers) : s(step), t0(Clock::now()), stats(ranks, layers) {}
};

Trainer::Trainer(const Config& cfg, const Comm& comm, const std::string& resume, int64_t stop_at, bool weights_given)
    : cfg_(cfg),
      comm_(comm),
      ds_(open_data(data_settings(cfg))),
      set_(from_config(cfg, ds_.vocab_size())),
      dims_(set_.model),
      model_(dims_, set_.lora),
      opt_(set_.optim, model_.weights().size(),  // train.zero = 1: this rank's slice of the moments
           set_.train.zero ? slice_of(model_.weights().size(), comm.rank(), comm.size())
                           : Slice{0, model_.weights().size()}),
      lm_(ModelShape{dims_.n_layers, set_.attention.block_size, set_.attention.local_blocks}),
      rm_(lm_.shape(), set_.balance.recall_alpha, set_.balance.ema),
      engine_(make_engine(set_.engine(), comm, model_, opt_)),
      faults_(set_.train),
      stop_at_(stop_at) {
  for (const auto& src : set_.data.sources) weights_.push_back(src.weight);
  if (!set_.balance.profile.empty()) lm_ = LatencyModel::load_file(set_.balance.profile, &lm_.shape());
  lm_.set_ema(set_.balance.ema);
  if (set_.balance.split_docs && !set_.data.split_long)
    throw Error("balance.split_docs = true needs data.long_docs = \"split\" (documents are split by the same machinery)");
  part_groups_.set_mode(set_.attention.part_exchange);
  engine_->part_exchange = &part_groups_.exchange_f32();
  engine_->part_groups = &part_groups_;
  if (!set_.attention.sparse && set_.balance.dst.tuning == Tuning::Dst)
    throw Error("balance.tuning = \"dst\" needs attention.mode = \"sparse\" (dense attention has no budget to tune)");

  model_.init(set_.train.seed, /*draw_base=*/!weights_given);
  if (set_.lora.on() && !weights_given) {
    base_ = "random, train.seed = " + std::to_string(set_.train.seed);
    hash_base();
  } else if (set_.lora.on()) {
    base_ = "the --init-from weights", base_xxh64_ = "on the init-from line";
  }
  const bool resumed = restore(resume);  // src/train/resume.cpp
  if (!resumed && set_.balance.profile.empty() && set_.balance.self_profile) {
    // On train.device (its own engine, weights and activations, freed before training starts).
    ProfileReport pr = profile_machine(set_, comm, /*quick=*/true);
    lm_ = pr.model;
    lm_.set_ema(set_.balance.ema);
    if (comm.root())
      std::printf("latency model: quick self-profile, %d samples in %.1f s (attention held-out error %.0f%%)\n",
                  pr.samples, pr.seconds, 100 * pr.attention.heldout_error);
  }
  engine_->from_host();  // the initial or restored weights and moments
  if (const std::string dev = engine_->memory_line(); comm.root()) {
    if (set_.lora.on())
      std::printf("LoRA: rank %d, alpha %g: frozen base of %zu parameters (%.1f MiB fp32, no gradient or moments; %s, "
                  "XXH64 %s), trainable %zu\n", set_.lora.rank, set_.lora.alpha, model_.base().size(),
                  double(model_.base().size()) * sizeof(float) / (1024.0 * 1024.0), base_.c_str(), base_xxh64_.c_str(),
                  model_.weights().size());
    std::printf("%s\n", memory_line(opt_, set_.train.zero, set_.lora.on() ? model_.base().size() : 0).c_str());
    if (!dev.empty()) std::printf("%s\n", dev.c_str());
  }
  if (comm.root()) {
    std::vector<std::string> inputs;  // the log must never replace a shard this run reads
    for (const auto& sh : ds_.shards()) inputs.push_back(sh.path());
    const std::string& lp = set_.log.path;
    const std::string copy =  // a branch keeps the abandoned run's log in its archive (resume.hpp)
        archive_.empty() ? "" : (std::filesystem::path(archive_) / std::filesystem::path(lp).filename()).string();
    log_ = open_metrics_log(lp, comm.size(), resumed, start_step_, copy, inputs, int(weights_.size()));
  }
}

// Weights from elsewhere (a converted checkpoint) for a fresh run; false when resumed.
bool Trainer::set_initial_weights(std::vector<float> w, const std::string& source) {
  if (set_.lora.on()) {  // the base, also under a resumed run (whose trained copies stay)
    if (w.size() != model_.base().size()) throw std::logic_error("Trainer::set_initial_weights: size differs from the base's");
    model_.set_base(std::move(w), last_checkpoint_.empty());
    base_ = source.empty() ? "given weights" : source;
    hash_base();
    engine_->from_host();
    return true;
  }
  if (!last_checkpoint_.empty()) return false;
  if (w.size() != model_.weights().size()) throw std::logic_error("Trainer::set_initial_weights: size differs from the model's");
  model_.weights() = std::move(w);
  engine_->from_host();
  return true;
}

bool Trainer::set_initial_adapters(std::vector<float> w) {
  if (!last_checkpoint_.empty()) return false;
  if (w.size() != model_.weights().size()) throw std::logic_error("Trainer::set_initial_adapters: size differs from the layout's");
  model_.weights() = std::move(w);
  engine_->from_host();
  return true;
}

void Trainer::hash_base() {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(xxh64(model_.base().data(), model_.base().size() * sizeof(float))));
  base_xxh64_ = hex;
}

void Trainer::save_checkpoint(int64_t s) {
  faults_.at(Faults::Phase::Checkpoint, s, comm_.rank());
  if (set_.lora.on()) {  // the frozen base is what the checkpoint says it is: hashed again, never changed
    const std::string was = base_xxh64_;
    hash_base();
    if (base_xxh64_ != was)
      throw std::logic_error("LoRA: the frozen base changed during training (XXH64 " + was + " -> " + base_xxh64_ + ")");
  }
  std::string path = checkpoint_path(set_.checkpoint.dir, s);
  std::string err;
  Checkpoint ck;
  ck.step = s;
  ck.ranks = comm_.size();
  ck.config_toml = cfg_.to_toml();
  ck.data_epoch = cur_.epoch;
  ck.data_cursor = cur_.index;
  if (!weights_.empty()) ck.source_epochs = mix_.epochs, ck.source_indexes = mix_.indexes, ck.data_draws = mix_.draws;
  ck.skipped_steps = skipped_;
  for (const auto& p : model_.params()) ck.tensors.push_back({p.name, p.shape, p.offset, p.size});
  auto extra = [&](hid_t f) {
    h5::Id g = h5::group(f, "latency", true);
    lm_.save(g);
    std::vector<double> alphas;
    for (int l = 0; l < dims_.n_layers; ++l) alphas.push_back(rm_.alpha(l));
    h5::write_vector(f, "recall/alpha", alphas);
    if (set_.lora.on()) {  // the base by reference (io/README.md, "LoRA checkpoints")
      h5::Id lg = h5::group(f, "lora", true);
      h5::write_attr(lg, "base", base_);
      h5::write_attr(lg, "base_xxh64", base_xxh64_);
      h5::write_attr(lg, "rank", int64_t(set_.lora.rank));
      h5::write_attr(lg, "alpha", set_.lora.alpha);
      h5::write_attr(lg, "vocab", int64_t(dims_.vocab));  // for exports: the adapters alone do not show it
    }
  };
  if (set_.train.zero || comm_.root()) {
    try {
      engine_->to_host();
      if (set_.train.zero) {  // every rank its slice of the moments, into one file (io/checkpoint.hpp)
        write_checkpoint_slices(path, ck, {model_.weights(), opt_.slice().lo, opt_.m(), opt_.v()}, MPI_COMM_WORLD,
                                 kCollectiveCheckpoints ? CheckpointIo::Collective : CheckpointIo::Stream, extra);
      } else {
        ck.params = model_.weights();
        ck.m = opt_.m();
        ck.v = opt_.v();
        write_checkpoint(path, ck, extra);
      }
      if (comm_.root()) prune_checkpoints(set_.checkpoint.dir, set_.checkpoint.keep);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  comm_.broadcast(err);  // every rank learns the outcome, so all stop or all go on (zero: it already has)
  if (err.empty()) {
    last_checkpoint_ = path;
    return;
  }
  if (set_.checkpoint.on_error_stop) throw Error(err + " (checkpoint.on_error = \"stop\")");
  if (comm_.root()) std::fprintf(stderr, "warning: %s; training continues (checkpoint.on_error = \"continue\")\n", err.c_str());
}

// One step on every rank. Each phase is one function below, in this order.
Trainer::StepOut Trainer::step(int64_t s) {
  StepState st(s, comm_.size(), dims_.n_layers);
  plan(st);
  predict(st);
  exchange(st);
  tune(st);
  compute(st);
  reduce(st);
  update(st);
  measure(st);
  return record(st);
}

// ---- plan: the global batch and its split over ranks x micro-batches (same on every rank)
void Trainer::plan(StepState& st) {
  faults_.at(Faults::Phase::Plan, st.s, comm_.rank());
  st.gb = weights_.empty()
              ? draw_global_batch(ds_, set_.data.seed, set_.data.val_fraction, set_.train.global_batch_tokens, cur_, order_)
              : draw_mixture_batch(ds_, weights_, set_.data.seed, set_.data.val_fraction, set_.train.global_batch_tokens,
                                   mix_, mix_orders_);
  lm_.set_part_gating(part_gating_of(set_.train.device));  // the costs of documents' parts
  lm_.set_dense_layers(set_.attention.dense);                 // hybrid layers cost dense, DST leaves them
  // This rank's micro-batches, its parts of documents split over rank groups included (src/parts).
  RankBatches rb = plan_step_batches(st.gb.docs, set_.batching(), lm_, dims_, comm_, part_groups_);
  st.segs = std::move(rb.segs);
  st.mine = std::move(rb.mine);
  st.planned = rb.planned;
  st.parts = std::move(rb.parts);
  st.exchange_ms = std::move(rb.exchange_ms);
  st.targets = count_targets(ds_, st.segs) + count_targets(ds_, rb.split);
  if (comm_.root() && !set_.log.batches.empty())
    append_batch_log(set_.log.batches, st.s, st.s == start_step_ + 1 && start_step_ == 0, ds_, st.segs, st.targets);
}

// ---- predict: this rank's items (micro-batch x layer) at every allowed budget, summarized
void Trainer::predict(StepState& st) {
  faults_.at(Faults::Phase::Predict, st.s, comm_.rank());
  const DstParams& p = set_.balance.dst;
  // A split part is costed as its rows of the whole document (their kept blocks), not as a sequence.
  std::vector<int64_t> doc_len(st.mine.size(), 0);
  for (size_t i = 0; i < st.parts.size(); ++i) doc_len[st.planned + i] = st.parts[i].doc_len;
  dst_work_.in.mine = build_items(st.mine, lm_, rm_, p, doc_len, st.exchange_ms);
  st.summary = pack(summarize(dst_work_.in.mine, p), p);
}

// ---- exchange: one collective (Comm's all-gather); every summary has the same size, so ranks need
// not know each other's plans (two-level plans)
void Trainer::exchange(StepState& st) {
  faults_.at(Faults::Phase::Exchange, st.s, comm_.rank());
  RankExchange ex{comm_.rank(), comm_.size(), [&](auto mine, auto all) { comm_.allgather(mine, all); }};
  exchange_summaries(ex, st.summary, dst_work_.gathered, dst_work_.in.ranks);
}

// ---- tune: T* from every summary, then this rank's budgets (one per micro-batch and layer)
void Trainer::tune(StepState& st) {
  faults_.at(Faults::Phase::Tune, st.s, comm_.rank());
  st.tuned = sb::tune(dst_work_.in, comm_.rank(), set_.balance.dst);
  for (size_t m = st.planned; m < st.tuned.k.size(); ++m)  // this rank's rows of documents in parts
    for (int k : st.tuned.k[m])
      part_budgets_.lo = std::min(part_budgets_.lo, k), part_budgets_.hi = std::max(part_budgets_.hi, k), ++part_budgets_.items;
  st.plan_ms = ms_since(st.t0);
}

// ---- compute: forward/backward of each micro-batch with its own budgets
void Trainer::compute(StepState& st) {
  faults_.at(Faults::Phase::Compute, st.s, comm_.rank());
  const int me = comm_.rank();
  RankStats& my = st.stats.ranks[size_t(me)];
  my.budget_min = 1e300, my.budget_max = -1e300;
  const float loss_scale = float(1.0 / double(std::max<int64_t>(st.targets, 1)));
  engine_->zero_grads();
  const auto t_compute = Clock::now();
  for (size_t m = 0; m < st.mine.size(); ++m) {
    const MicroBatch& mb = st.mine[m];
    PackedBatch b = m < st.planned ? pack_micro_batch(ds_, mb) : pack_part(ds_, mb, st.parts[m - st.planned]);
    AttnSettings a = set_.attention.for_budgets(std::move(st.tuned.k[m]));
    if ((st.s - 1) % set_.balance.recall_every == 0) a.recall_rows = set_.balance.recall_rows;  // true recall this step
    if (set_.lora.dropout > 0)  // this micro-batch's draw: the same on every engine and on resume
      engine_->set_dropout_key(kernels::dropout_micro_batch_key(set_.train.seed, st.s, me, int(m)));
    MicroBatchStats ms = engine_->forward_backward(b, a, loss_scale, m + 1 == st.mine.size());
    my.tokens += double(b.n());
    if (m < st.planned) {
      st.stats.add_micro_batch(me, mb, b.n(), a, ms, lm_.micro_batch_parts(mb, a.k), lm_, set_.balance.dst.k0, dims_);
    } else {  // a document's part: predicted as its share of the whole document (part_times)
      AttnSettings no_cand = a;  // the candidate-density check assumes whole segments: not for a part
      no_cand.sparse = false;
      st.stats.add_micro_batch(me, mb, b.n(), no_cand, ms, part_times(lm_, mb, st.parts[m - st.planned].doc_len, a.k, b.n()),
                               lm_, set_.balance.dst.k0, dims_);
    }
  }
  my.compute_ms = ms_since(t_compute);
  my.mem_peak = engine_->peak_memory_bytes();
  my.predicted_ms = st.tuned.my_predicted_ms;
  my.micro_batches = double(st.mine.size());
  if (my.budget_n == 0) my.budget_min = my.budget_max = 0;
  my.stop = (g_stop_signal.load() != 0 || (stop_at_ > 0 && st.s >= stop_at_)) ? 1 : 0;
}

// ---- reduce: the wait for the slowest rank is the bubble; then gradients and stats
void Trainer::reduce(StepState& st) {
  faults_.at(Faults::Phase::Reduce, st.s, comm_.rank());
  const int me = comm_.rank();
  RankStats& my = st.stats.ranks[size_t(me)];
  const auto t_idle = Clock::now();
  comm_.barrier();
  my.idle_ms = ms_since(t_idle);
  // Fault injection, a testing aid (train.inject_nan_step/_count): rank 0 poisons its loss and one
  // gradient before the reduction, so every rank sees the non-finite values, as with a real overflow.
  if (const int64_t inj = set_.train.inject_nan_step;
      inj > 0 && st.s >= inj && st.s < inj + set_.train.inject_nan_count && me == 0) {
    st.stats.loss_sum = std::numeric_limits<double>::quiet_NaN();
    engine_->poison_gradient();
  }
  engine_->reduce_gradients();
  my.step_ms = ms_since(st.t0);
  st.stats.allreduce(comm_);  // the step's one stats collective
}

// ---- update: AdamW, or skip a non-finite step (train.nonfinite); then the sync check
void Trainer::update(StepState& st) {
  faults_.at(Faults::Phase::Update, st.s, comm_.rank());
  const int64_t s = st.s;
  st.loss = st.stats.loss_sum / double(std::max<int64_t>(st.targets, 1));
  st.gnorm = engine_->gradient_norm();
  st.lr = opt_.lr(s);
  st.finite = std::isfinite(st.loss) && std::isfinite(st.gnorm);
  if (st.finite) {
    engine_->update(st.gnorm, st.lr, s);
    skipped_ = 0;
  } else {
    ++skipped_;
    if (set_.train.nonfinite_stop)
      throw Error("step " + std::to_string(s) + ": non-finite loss or gradient (train.nonfinite = \"stop\"); the last "
                  "checkpoint is " + (last_checkpoint_.empty() ? std::string("none") : last_checkpoint_));
    if (skipped_ > set_.train.max_skips)
      throw Error("step " + std::to_string(s) + ": " + std::to_string(skipped_) +
                  " consecutive non-finite steps skipped, more than train.max_skips = " +
                  std::to_string(set_.train.max_skips));
    if (comm_.root()) std::fprintf(stderr, "warning: step %lld skipped: non-finite loss or gradient\n", static_cast<long long>(s));
  }

  const int64_t sync_every = set_.train.sync_check_every;
  if (sync_every > 0 && s % sync_every == 0 && !comm_.all_equal(engine_->weights_hash()))
    throw Error("step " + std::to_string(s) + ": ranks hold different parameters after the update (the all-reduce "
                "or the update is not deterministic); stopping before the divergence spreads");
}

// ---- measure: every rank updates its latency and recall models from the same sums
void Trainer::measure(StepState& st) {
  faults_.at(Faults::Phase::Measure, st.s, comm_.rank());
  const bool sparse = set_.attention.sparse;
  const RankStats sum = st.stats.sum();
  lm_.observe(Part::Attention, sum.pred_attn, sum.attn_ms);
  if (sparse) lm_.observe(Part::Gating, sum.pred_gating, sum.gating_ms);
  lm_.observe(Part::Linear, sum.pred_linear, std::max(1e-6, sum.compute_ms - sum.attn_ms - sum.gating_ms));
  if (sparse && sum.cand_pred > 0) lm_.observe_density(sum.cand_pred, sum.cand_meas);
  for (int l = 0; l < dims_.n_layers && sparse; ++l) {
    const LayerStats& g = st.stats.layers[size_t(l)];
    // true recall where sampled (balance.recall_rows), else the gate's estimate unless true recall is on
    if (g.causal > 0 && g.true_rows > 0) rm_.observe(l, g.kept / g.causal, g.true_recall_sum / g.true_rows);
    else if (g.causal > 0 && g.rows > 0 && set_.balance.recall_rows == 0) rm_.observe(l, g.kept / g.causal, g.recall_sum / g.rows);
  }
}

// ---- record: the step's rows (the log and checkpoint are written by run())
Trainer::StepOut Trainer::record(StepState& st) {
  faults_.at(Faults::Phase::Record, st.s, comm_.rank());
  StepOut out;
  out.ranks = st.stats.rank_rows(st.s);
  for (size_t i = 0; i < weights_.size(); ++i)
    out.sources.push_back({st.s, int32_t(i), st.gb.source_docs[i], st.gb.source_tokens[i]});
  StepRow& row = out.row;
  row.step = st.s, row.loss = st.loss, row.grad_norm = st.gnorm, row.lr = st.lr, row.tokens = st.gb.tokens;
  st.stats.fill(row, st.gb.tokens, set_.train.peak_tflops * 1e12);
  row.plan_ms = st.plan_ms;
  row.skipped = st.finite ? 0 : 1;
  const RankStats sum = st.stats.sum();
  out.above = int64_t(sum.above), out.below = int64_t(sum.below);
  out.stop = sum.stop > 0;
  return out;
}

TrainResult Trainer::run() {
  if (set_.lora.on() && !ck_base_xxh64_.empty() && ck_base_xxh64_ != base_xxh64_)
    throw Error("resume: " + last_checkpoint_ + " trained LoRA adapters on the base " + ck_base_ + " (XXH64 " +
                ck_base_xxh64_ + "), but this run's base is " + base_ + " (XXH64 " + base_xxh64_ +
                "): pass the checkpoint's base (train --init-from PATH), or start afresh");
  RunSummary summary(set_.log.path, start_step_ + 1);
  const int64_t total = set_.train.steps, every = set_.checkpoint.every;
  const bool progress = set_.log.progress && comm_.root();
  bool stopped_early = false;
  for (int64_t s = start_step_ + 1; s <= total; ++s) {
    StepOut o = step(s);
    if (log_) {
      log_->append(o.row, o.ranks, o.sources);
      if (s % set_.log.every == 0 || s == total || o.stop) log_->flush();
    }
    if (progress) print_progress(o.row, total);
    summary.add(o.row, o.above, o.below);
    if (!o.sources.empty()) summary.add_sources(o.sources);
    const bool last = s == total || o.stop;
    if (last || (every > 0 && s % every == 0)) {
      if (log_) log_->flush();  // the log holds every step a checkpoint covers: a kill after it loses no row
      save_checkpoint(s);
    }
    if (o.stop && s < total) {
      stopped_early = true;
      if (comm_.root()) std::printf("stopping after step %lld as asked; checkpoint %s\n", static_cast<long long>(s), last_checkpoint_.c_str());
      break;
    }
  }
  if (log_) log_->flush();
  engine_->to_host();  // model() holds the trained weights
  if (const std::string dev = engine_->memory_line(); comm_.root()) {
    std::printf("%s\n", memory_line(opt_, set_.train.zero, set_.lora.on() ? model_.base().size() : 0).c_str());
    if (!dev.empty()) std::printf("%s\n", dev.c_str());
  }
  return summary.finish(last_checkpoint_, stopped_early);
}

}  // namespace sb
