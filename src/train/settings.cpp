#include "src/train/settings.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "base/error.hpp"

namespace sb {

DataSettings data_settings(const Config& cfg) {
  DataSettings d{cfg.s("data.path"), cfg.sources("data.sources"), uint64_t(cfg.i("data.seed")), cfg.f("data.val_fraction"),
                 cfg.s("data.long_docs") == "reject", cfg.s("data.long_docs") == "split"};
  if (d.sources.empty()) return d;
  if (cfg.given("data.path"))
    throw Error((cfg.source().empty() ? std::string("--set") : cfg.source()) + ": data.path and data.sources are both given; "
                "expected one of them: data.path for one dataset, or data.sources for a weighted mixture (a --set of one "
                "replaces the other where the config file gives it)");
  double sum = 0;
  for (const auto& s : d.sources) sum += s.weight;
  d.path.clear();
  for (auto& s : d.sources) {
    s.weight /= sum;
    d.path += (d.path.empty() ? "" : " + ") + s.path;
  }
  return d;
}

std::vector<uint8_t> parse_dense_layers(const std::string& text, int n_layers, const std::string& n_layers_key) {
  std::vector<uint8_t> dense(size_t(std::max(n_layers, 0)), 0);
  const std::string range = "0.." + std::to_string(n_layers - 1) + " (" + n_layers_key + " = " + std::to_string(n_layers) + ")";
  auto bad = [&](const std::string& item, const std::string& why) {
    return Error("attention.dense_layers = \"" + text + "\": \"" + item + "\" " + why);
  };
  auto number = [&](const std::string& item, const std::string& digits) {
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
      throw bad(item, "is not a layer index or last:N (expected e.g. \"last:3\" or \"0,5,7\")");
    return std::stoi(digits);
  };
  size_t at = 0;
  bool any = false;
  while (at <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, end - at);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.rfind("last:", 0) == 0) {
      const int n = number(item, item.substr(5));
      if (n < 1 || n > n_layers) throw bad(item, "asks for the last " + std::to_string(n) + " layers: expected 1.." + std::to_string(n_layers) + " (" + n_layers_key + " = " + std::to_string(n_layers) + ")");
      for (int l = n_layers - n; l < n_layers; ++l) dense[size_t(l)] = 1;
    } else {
      const int l = number(item, item);
      if (l >= n_layers) throw bad(item, "is outside the layers " + range);
      dense[size_t(l)] = 1;
    }
    any = true;
    at = end + 1;
  }
  if (!any) return {};
  return dense;
}

ModelDims model_dims(const Config& cfg, int64_t data_vocab) {
  ModelDims s;
  s.n_layers = int(cfg.i("model.n_layers"));
  s.d_model = int(cfg.i("model.d_model"));
  s.n_heads = int(cfg.i("model.n_heads"));
  s.n_kv_heads = int(cfg.i("model.n_kv_heads"));
  s.ffn_dim = int(cfg.i("model.ffn_dim"));
  s.tied = cfg.b("model.tie_embeddings");
  s.qkv_bias = cfg.b("model.qkv_bias");
  s.rope_theta = cfg.f("model.rope_theta");
  s.norm_eps = cfg.f("model.norm_eps");
  s.init_std = cfg.f("model.init_std");
  int64_t v = cfg.i("model.vocab_size");
  if (v == 0) v = data_vocab;
  if (v <= 0) throw Error("model.vocab_size = 0 means 'from the data', but no data vocab_size is known");
  if (data_vocab > 0 && v < data_vocab)
    throw Error("model.vocab_size = " + std::to_string(v) + " is smaller than the data's vocab_size " +
                std::to_string(data_vocab));
  s.vocab = int(v);
  if (cfg.i("model.head_dim") == 0 && s.d_model % s.n_heads)  // with model.head_dim set, any d_model
    throw Error("model.d_model = " + std::to_string(s.d_model) + " must be divisible by model.n_heads = " +
                std::to_string(s.n_heads) + " (or set model.head_dim)");
  if (s.n_heads % s.n_kv_heads)
    throw Error("model.n_heads = " + std::to_string(s.n_heads) + " must be divisible by model.n_kv_heads = " +
                std::to_string(s.n_kv_heads));
  const int64_t hd = cfg.i("model.head_dim");
  s.head_dim = hd > 0 ? int(hd) : s.d_model / s.n_heads;
  if (s.head_dim % 2)
    throw Error("head dim " + std::string(hd > 0 ? "model.head_dim" : "d_model/n_heads") + " = " +
                std::to_string(s.head_dim) + " must be even (RoPE)");
  s.qk_norm = cfg.b("model.qk_norm");
  if (s.qk_norm && s.qkv_bias)
    throw Error("model.qk_norm = true with model.qkv_bias = true is not supported (Qwen3 has no q/k/v biases)");
  RopeScaling& r = s.rope_scaling;
  r.type = cfg.s("model.rope_scaling.type");
  r.factor = cfg.f("model.rope_scaling.factor");
  r.original_max_positions = int(cfg.i("model.rope_scaling.original_max_position_embeddings"));
  r.low_freq_factor = cfg.f("model.rope_scaling.low_freq_factor");
  r.high_freq_factor = cfg.f("model.rope_scaling.high_freq_factor");
  r.beta_fast = cfg.f("model.rope_scaling.beta_fast");
  r.beta_slow = cfg.f("model.rope_scaling.beta_slow");
  r.attention_factor = cfg.f("model.rope_scaling.attention_factor");
  r.truncate = cfg.b("model.rope_scaling.truncate");
  check_rope_scaling(r);
  return s;
}

OptimSettings optim_settings(const Config& cfg) {
  return {cfg.f("train.lr"),    cfg.f("train.min_lr_ratio"), cfg.f("train.weight_decay"),
          cfg.f("train.beta1"), cfg.f("train.beta2"),        cfg.f("train.adam_eps"),
          cfg.f("train.grad_clip"), cfg.i("train.warmup_steps"),
          cfg.i("train.decay_steps") > 0 ? cfg.i("train.decay_steps") : cfg.i("train.steps")};
}

// [balance] keys shared by `train` and `simulate` (k0 and n_layers are the caller's).
static DstParams dst_params(const Config& cfg, int k0, int n_layers) {
  DstParams p;
  p.k0 = k0, p.n_layers = n_layers;
  p.k_min = int(cfg.i("balance.k_min")), p.k_max = int(cfg.i("balance.k_max"));
  p.max_change = cfg.f("balance.max_change");
  p.target = parse_target(cfg.s("balance.target")), p.tuning = parse_tuning(cfg.s("balance.tuning"));
  p.curve_points = int(cfg.i("balance.curve_points"));
  return p;
}

static PlanOptions plan_options(const Config& cfg) {
  PlanOptions o;
  o.swap_rounds = int(cfg.i("balance.swap_rounds"));
  o.group_ranks = int(cfg.i("balance.group_ranks"));
  return o;
}

// A comma-separated list of names, each one of `names` (any order, no repeats) -> flags.
template <size_t K>
static std::array<bool, K> parse_names(const std::string& key, const std::string& text,
                                       const std::array<const char*, K>& names) {
  std::array<bool, K> on{};
  std::string list;
  for (const char* n : names) list += std::string(list.empty() ? "" : ", ") + n;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(at, end - at);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    at = end + 1;
    if (item.empty()) {
      if (text.find_first_not_of(" \t") == std::string::npos) break;  // an empty list
      throw Error(key + " = \"" + text + "\": an empty item; expected a comma-separated list of " + list);
    }
    size_t i = 0;
    while (i < K && item != names[i]) ++i;
    if (i == K) throw Error(key + " = \"" + text + "\": unknown item \"" + item + "\"; expected any of " + list);
    if (on[i]) throw Error(key + " = \"" + text + "\": \"" + item + "\" is listed twice");
    on[i] = true;
  }
  return on;
}

LoraSpec lora_spec(const Config& cfg) {
  LoraSpec s;
  s.rank = int(cfg.i("lora.rank"));
  s.alpha = cfg.f("lora.alpha");
  s.dropout = cfg.f("lora.dropout");
  if (s.dropout >= 1)
    throw Error("lora.dropout = " + std::to_string(s.dropout) + ": expected a probability below 1 (0: no dropout, the "
                "default; README.md, 'LoRA')");
  s.targets = parse_names(std::string("lora.targets"), cfg.s("lora.targets"), kLoraTargetNames);
  const auto also = parse_names(std::string("lora.train_also"), cfg.s("lora.train_also"),
                                std::array<const char*, 3>{"embed", "norm", "head"});
  s.embed = also[0], s.norm = also[1], s.head = also[2];
  if (s.on() && std::none_of(s.targets.begin(), s.targets.end(), [](bool b) { return b; }))
    throw Error("lora.targets is empty with lora.rank = " + std::to_string(s.rank) +
                ": name at least one of q, k, v, o, gate, up, down (or set lora.rank = 0 for full fine-tuning)");
  return s;
}

Settings from_config(const Config& cfg, int64_t data_vocab) {
  Settings s;
  s.model = model_dims(cfg, data_vocab);
  s.optim = optim_settings(cfg);

  AttnSettings& a = s.attention;
  a.sparse = cfg.s("attention.mode") == "sparse";
  a.block_size = int(cfg.i("attention.block_size"));
  a.local_blocks = int(cfg.i("attention.local_blocks"));
  a.theta = cfg.f("attention.theta");
  a.gate_query = cfg.s("attention.gate_query") == "max" ? kernels::GateQuery::max : kernels::GateQuery::mean;
  const std::string gk = cfg.s("attention.gate_key");
  a.gate_key = gk == "bounds" ? kernels::GateKey::bounds : gk == "sub" ? kernels::GateKey::sub : kernels::GateKey::mean;
  a.gate_sub_blocks = int(cfg.i("attention.gate_sub_blocks"));
  if (a.gate_key == kernels::GateKey::sub && a.block_size % a.gate_sub_blocks != 0)
    throw Error("attention.gate_sub_blocks = " + std::to_string(a.gate_sub_blocks) + " must divide attention.block_size = " +
                std::to_string(a.block_size) + " (attention.gate_key = \"sub\" cuts each block into that many equal sub-blocks)");
  a.dense = parse_dense_layers(cfg.s("attention.dense_layers"), s.model.n_layers, "model.n_layers");
  const std::string ex = cfg.s("attention.part_exchange");
  a.part_exchange = ex == "allgather" ? PartExchangeMode::AllGather
                     : ex == "selective" ? PartExchangeMode::Selective
                                         : PartExchangeMode::Auto;

  BalanceSettings& b = s.balance;
  b.batching = parse_batching(cfg.s("balance.batching"));
  b.plan = plan_options(cfg);
  b.dst = dst_params(cfg, int(cfg.i("attention.k")), s.model.n_layers);  // the one k0
  b.profile = cfg.s("balance.profile");
  b.self_profile = cfg.b("balance.self_profile");
  b.split_docs = cfg.b("balance.split_docs");
  b.part_share = cfg.f("balance.part_share");
  b.ema = cfg.f("balance.ema");
  b.recall_alpha = cfg.f("balance.recall_alpha");
  b.recall_rows = int(cfg.i("balance.recall_rows"));
  b.recall_every = cfg.i("balance.recall_every");

  TrainSettings& t = s.train;
  t.steps = cfg.i("train.steps");
  t.global_batch_tokens = cfg.i("train.global_batch_tokens");
  t.micro_batch_tokens = cfg.i("train.micro_batch_tokens");
  if (t.micro_batch_tokens < a.block_size)  // else the latency fit gets too few samples, naming neither key
    throw Error("train.micro_batch_tokens = " + std::to_string(t.micro_batch_tokens) + " is below attention.block_size = " +
                std::to_string(a.block_size) + ": a micro-batch must hold at least one attention block (raise "
                "train.micro_batch_tokens to >= " + std::to_string(a.block_size) + " or lower attention.block_size)");
  t.seed = uint64_t(cfg.i("train.seed"));
  t.device = cfg.s("train.device");
  t.bucket_mb = cfg.f("train.bucket_mb");
  t.overlap_reduce = cfg.b("train.overlap_reduce");
  t.phase_times = cfg.b("train.phase_times");
  t.zero = cfg.i("train.zero") == 1;
  t.nonfinite_stop = cfg.s("train.nonfinite") == "stop";
  t.max_skips = cfg.i("train.max_skips");
  t.sync_check_every = cfg.i("train.sync_check_every");
  t.inject_nan_step = cfg.i("train.inject_nan_step");
  t.inject_nan_count = cfg.i("train.inject_nan_count");
  t.inject_error_rank = cfg.i("train.inject_error_rank");
  t.inject_error_step = cfg.i("train.inject_error_step");
  t.inject_error_phase = cfg.s("train.inject_error_phase");
  t.exec.lm_head_chunk = int(cfg.i("model.lm_head_chunk"));
  t.exec.recompute = cfg.s("train.recompute") == "layer";
  // H200 (= H100 SXM) dense bf16 tensor-core peak, as bench/torch/torch_model_ref.py.
  t.peak_tflops = cfg.f("train.peak_tflops") > 0 ? cfg.f("train.peak_tflops") : t.device == "cuda" ? 989.0 : 0.0;

  s.data = data_settings(cfg);
  s.checkpoint = {cfg.s("checkpoint.dir"), cfg.i("checkpoint.every"), cfg.i("checkpoint.keep"),
                  cfg.s("checkpoint.on_error") == "stop"};
  s.log = {cfg.s("log.path"), cfg.i("log.every"), cfg.b("log.progress"), cfg.s("log.batches")};
  s.eval = {cfg.i("eval.docs"), cfg.s("eval.buckets"), int(cfg.i("eval.diagnose_rows"))};
  s.lora = lora_spec(cfg);
  return s;
}

PartGating part_gating_of(const std::string& device) {
  return device == "cuda" ? PartGating::Whole : PartGating::OwnRows;
}

SimulateSettings simulate_settings(const Config& cfg) {
  SimulateSettings s;
  SimConfig& sc = s.sim;
  sc.ranks = int(cfg.i("simulate.ranks")), sc.micro_batches = int(cfg.i("simulate.micro_batches"));
  sc.steps = int(cfg.i("simulate.steps")), sc.preset = parse_preset(cfg.s("simulate.preset"));
  sc.seed = uint64_t(cfg.i("simulate.seed")), sc.fill = cfg.f("simulate.fill");
  sc.capacity = cfg.i("simulate.capacity");
  sc.max_len = cfg.i("simulate.max_len") > 0 ? cfg.i("simulate.max_len") : sc.capacity;
  sc.noise = cfg.f("simulate.noise");
  sc.split_long = cfg.s("simulate.long_docs") == "split";
  sc.split_docs = cfg.b("balance.split_docs");
  sc.part_share = cfg.f("balance.part_share");
  sc.kv_bytes_per_token = cfg.f("simulate.kv_bytes_per_token");
  sc.plan = plan_options(cfg);
  s.shape = ModelShape{int(cfg.i("simulate.n_layers")), int(cfg.i("simulate.block_size")),
                       int(cfg.i("simulate.local_blocks"))};
  sc.dst = dst_params(cfg, int(cfg.i("simulate.k")), s.shape.n_layers);
  sc.dst.tuning = Tuning::Dst;  // set per policy by simulate(); balance.tuning is not a simulate setting
  s.profile = cfg.s("balance.profile");
  s.part_gating = part_gating_of(cfg.s("train.device"));
  s.mb_overhead_ms = cfg.f("simulate.mb_overhead_ms");
  s.linear_us_per_token = cfg.f("simulate.linear_us_per_token");
  s.attn_ps_per_pair = cfg.f("simulate.attn_ps_per_pair");
  s.gating_ns_per_pair = cfg.f("simulate.gating_ns_per_pair");
  s.alpha_lo = cfg.f("simulate.alpha_lo"), s.alpha_hi = cfg.f("simulate.alpha_hi");
  s.ema = cfg.f("balance.ema"), s.recall_alpha = cfg.f("balance.recall_alpha");
  s.dense_layers = cfg.s("attention.dense_layers");
  return s;
}

EngineSettings Settings::engine() const {
  return {train.device, train.bucket_mb, train.overlap_reduce, train.zero, train.exec, train.phase_times, attention.block_size, data.split_long};
}

BatchingSettings Settings::batching() const {
  BatchingSettings b;
  b.micro_batch_tokens = train.micro_batch_tokens;
  b.batching = balance.batching;
  b.plan = balance.plan;
  b.k0 = balance.dst.k0;
  b.reject_long = data.reject_long;
  b.parts = data.split_long;
  b.part_costly = balance.split_docs;
  b.part_share = balance.part_share;
  b.attention = attention;
  return b;
}

}  // namespace sb
