// sparsebalance profile: fit the latency model on this machine and save it (HDF5).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "io/h5.hpp"
#include "io/shard.hpp"
#include "src/cli/args.hpp"
#include "base/error.hpp"
#include "src/train/batch.hpp"
#include "src/train/profile.hpp"

namespace sb {

static int run_profile(const Args& args) {
  Config cfg = Config::load(args.positional.empty() ? "" : args.positional[0], args.sets);
  Comm comm;
  std::string out = args.get("output");
  if (out.empty()) throw Error("profile: --output FILE.h5 is required");
  // The vocabulary comes from the data when model.vocab_size = 0 (the LM head's cost depends on it).
  const int64_t data_vocab = cfg.i("model.vocab_size") == 0 ? open_data(data_settings(cfg)).vocab_size() : 0;
  ProfileReport r = profile_machine(from_config(cfg, data_vocab), comm, args.has("quick"));
  if (!comm.root()) return 0;
  LatencyProfile p = r.model.profile();
  save_latency_profile_file(out, p);
  std::printf("profile: %d samples in %.1f s on %s -> %s\n", r.samples, r.seconds, p.device.c_str(), out.c_str());
  nlohmann::json j = {{"output", out}, {"device", p.device}, {"samples", r.samples}, {"seconds", r.seconds}};
  const std::pair<const char*, const FitReport*> parts[] = {
      {"attention", &r.attention}, {"gating", &r.gating}, {"linear", &r.linear}, {"allreduce", &r.allreduce}};
  for (auto [name, f] : parts) {
    std::printf("  %-10s c0 %10.4g  c1 %10.4g  c2 %10.4g   held-out error %5.1f%% (%d samples)\n", name, f->coeffs[0],
                f->coeffs[1], f->coeffs[2], 100 * f->heldout_error, f->samples);
    j[name] = {{"coeffs", f->coeffs}, {"heldout_error", f->heldout_error}, {"samples", f->samples}};
  }
  if (args.has("summary")) write_summary(args.get("summary"), j);
  return 0;
}

Command cmd_profile() {
  return {"profile",
          "time the model's parts on this machine and fit the latency model",
          "profile [CONFIG.toml] --output FILE.h5 [--quick] [--set key=value]... [--summary PATH]\n\n"
          "Runs the configured model forward+backward on sequences of several lengths (up to\n"
          "train.micro_batch_tokens) at several attention budgets around attention.k, and the gradient\n"
          "all-reduce at several sizes over the launched ranks; fits per part\n"
          "  attention (per layer)  t = c0 + c1*tokens + c2*kept_blocks*Bs^2\n"
          "  gating (per layer)     t = c0 + c1*tokens + c2*causal_block_pairs\n"
          "  linear (whole model)   t = c0 + c1*tokens\n"
          "  allreduce              t = c0 + c1*bytes\n"
          "and writes the model, the device and the fit's error on held-out grid points to FILE.h5\n"
          "(group /latency). Use it with --set balance.profile=FILE.h5.\n",
          {{"output", 1, "profile file to write", "FILE.h5"}, {"quick", 0, "a smaller grid (seconds)", ""}},
          run_profile};
}

}  // namespace sb
