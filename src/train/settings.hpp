// Typed settings: every key the program acts on, read from the Config once, here, and passed
// down as plain values. Nothing below this file (kernels/, io/, src/model/, src/balance/) reads a
// Config; they take the structs they need (ModelDims, AttnSettings, DstParams, PlanOptions, ...).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/balance/dst.hpp"
#include "src/balance/latency_model.hpp"
#include "src/balance/plan.hpp"
#include "src/balance/simulate.hpp"
#include "src/config/config.hpp"
#include "src/model/model.hpp"
#include "src/engine/engine.hpp"
#include "src/engine/update.hpp"
#include "src/parts/step_batches.hpp"

namespace sb {

// [data]
struct DataSettings {
  std::string path;  // data.path; a mixture: its sources' paths joined by " + " (for messages)
  // data.sources (empty: data.path is the one dataset), the weights normalised to sum to 1.
  std::vector<SourceSpec> sources;
  uint64_t seed = 0;
  double val_fraction = 0;
  bool reject_long = false;  // data.long_docs = "reject"
  bool split_long = false;   // data.long_docs = "split" (neither: windows)
};

// [balance]: the plan (SAB), the tuner (DST) and the latency and recall models.
struct BalanceSettings {
  Batching batching = Batching::Sparse;
  PlanOptions plan;
  DstParams dst;             // k0 = attention.k (its one copy), n_layers = model.n_layers
  std::string profile;       // latency profile file ("" = analytic or self-profile)
  bool self_profile = true;
  bool split_docs = false;   // balance.split_docs: costly documents that fit are split too
  double part_share = 1.0;  // balance.part_share: their parts cost at most this x the fair share
  double ema = 0.3, recall_alpha = 0.5;
  int recall_rows = 0;      // balance.recall_rows: true recall on sampled rows per layer (0 = the gate's estimate)
  int64_t recall_every = 1; // balance.recall_every: on every this many steps
};

// [train] apart from the optimizer: the loop, the device and its gradient reduction, the
// non-finite policy and the testing aids.
struct TrainSettings {
  int64_t steps = 0, global_batch_tokens = 0, micro_batch_tokens = 0;
  uint64_t seed = 0;
  std::string device;  // "cpu" | "cuda"
  double bucket_mb = 4;
  bool overlap_reduce = true;
  bool phase_times = false;  // cuda: per-phase GPU times each step (src/model/phase_clock_cuda.hpp)
  bool zero = false;  // train.zero = 1: AdamW moments sliced over the ranks (ZeRO-1)
  bool nonfinite_stop = false;  // train.nonfinite = "stop" (else skip)
  int64_t max_skips = 0, sync_check_every = 0;
  int64_t inject_nan_step = 0, inject_nan_count = 0;
  int64_t inject_error_rank = 0, inject_error_step = 0;  // train.inject_error_*: Faults (faults.hpp); step 0 off
  std::string inject_error_phase;
  ModelExec exec;          // model.lm_head_chunk, train.recompute
  double peak_tflops = 0;  // per rank, for mfu: train.peak_tflops, or 0 = the device's (989 on cuda, none on cpu)
};

struct CheckpointSettings {
  std::string dir;
  int64_t every = 0, keep = 0;
  bool on_error_stop = true;  // checkpoint.on_error = "stop" (else continue)
};

struct LogSettings {
  std::string path;
  int64_t every = 1;
  bool progress = true;
  std::string batches;  // log.batches: the steps' documents as JSON lines (batch_log.hpp), "" = off
};

struct EvalSettings {
  int64_t docs = 0;
  std::string buckets;  // eval.buckets as written; `eval` parses it (a bad list fails eval, not train)
  int diagnose_rows = 16;  // eval.diagnose_rows: sampled rows per layer and document (eval --diagnose)
};

// Everything `train`, `eval` and `profile` act on.
struct Settings {
  ModelDims model;
  OptimSettings optim;
  AttnSettings attention;  // [attention], k empty (each micro-batch's budgets: for_budgets); k0 is balance.dst.k0
  BalanceSettings balance;
  TrainSettings train;
  DataSettings data;
  CheckpointSettings checkpoint;
  LogSettings log;
  EvalSettings eval;
  LoraSpec lora;  // [lora]; rank 0: off
  EngineSettings engine() const;      // what make_engine takes
  BatchingSettings batching() const;  // what plan_step_batches takes
};

// The whole Settings; data_vocab is the dataset's vocabulary (model.vocab_size = 0 takes it; 0
// when unknown). Errors name the keys at fault.
Settings from_config(const Config& cfg, int64_t data_vocab);
// [data] alone: what opens the dataset before the rest can be read (its vocabulary sizes the model).
DataSettings data_settings(const Config& cfg);
// [model]; vocab from model.vocab_size or, when 0, from data_vocab.
ModelDims model_dims(const Config& cfg, int64_t data_vocab);
OptimSettings optim_settings(const Config& cfg);
// [lora]: errors name the key (lora.targets, lora.train_also: the item and the choices; lora.dropout
// of 1).
LoraSpec lora_spec(const Config& cfg);

// `simulate`: the modelled cluster, and the analytic latency and recall models used when no
// profile is given (a profile brings its own shape).
struct SimulateSettings {
  SimConfig sim;            // dst.n_layers is set from the latency model actually used
  std::string profile;      // balance.profile
  ModelShape shape;         // analytic model's shape
  double mb_overhead_ms = 0, linear_us_per_token = 0, attn_ps_per_pair = 0, gating_ns_per_pair = 0;
  double alpha_lo = 0, alpha_hi = 0;  // recall exponents of the first and last layer
  double ema = 0, recall_alpha = 0;
  PartGating part_gating = PartGating::OwnRows;  // part_gating_of(train.device)
  std::string dense_layers;  // attention.dense_layers, parsed against the model's n_layers when known
};
SimulateSettings simulate_settings(const Config& cfg);
// attention.dense_layers ("" none; comma-separated indices and/or last:N) as n_layers flags (empty
// when none); errors name the key, the item and the range 0..n_layers-1 (n_layers_key says where
// n_layers comes from).
std::vector<uint8_t> parse_dense_layers(const std::string& text, int n_layers, const std::string& n_layers_key);
// How the engine of train.device gates a split document (the costs of its parts): the CPU engine
// its own rows, CUDA (src/model/part_attention_cuda.cpp) the whole document.
PartGating part_gating_of(const std::string& device);

}  // namespace sb
