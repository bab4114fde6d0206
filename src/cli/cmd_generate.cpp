// sparsebalance generate: continue a prompt with a checkpoint or a Hugging Face model directory
// (src/model/decode.hpp: the KV cache, the sampling), to look at what a model writes.
#include <mpi.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "io/checkpoint.hpp"
#include "src/cli/args.hpp"
#include "src/data/bpe_tokenizer.hpp"
#include "src/data/chat_template.hpp"
#include "src/data/tokenizer.hpp"
#include "src/hf/hf_convert.hpp"
#include "src/model/decode.hpp"
#include "src/train/weights.hpp"
#include "src/train/settings.hpp"
#ifdef SB_WITH_CUDA
#include "src/model/model_cuda.hpp"
#endif

namespace sb {

namespace fs = std::filesystem;
using json = nlohmann::json;

// "1,2,3" -> ids (flag names the flag in errors).
static std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    int32_t v = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v, 10);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
      throw Error(flag + " '" + text + "': expected token ids (integers >= 0) separated by commas");
    ids.push_back(v);
  }
  if (ids.empty()) throw Error(flag + " is empty: expected token ids separated by commas, e.g. 1,2,3");
  return ids;
}

// eos_token_id of an HF file (an id, a list of ids or null): appended to `out`.
static void eos_ids_of(const fs::path& file, std::vector<int32_t>& out) {
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    throw Error(file.string() + ": not valid JSON (" + e.what() + ")");
  }
  const json e = j.value("eos_token_id", json());
  for (const json& id : e.is_array() ? e : json::array({e}))
    if (id.is_number_integer()) out.push_back(id.get<int32_t>());
}

struct Loaded {
  Config cfg;
  Model<float> model;
  std::string tokenizer;      // default tokenizer.json ("" = none known)
  std::vector<int32_t> stop;  // end ids the model's files name
};

static Loaded load_model(const std::string& path, const std::vector<std::string>& sets) {
  if (!fs::exists(path)) throw Error(path + ": does not exist (expected a checkpoint .h5 or an HF model directory)");
  if (fs::is_directory(path)) {
    Config base;  // a pretrained HF model attends densely (what transformers computes) unless --set says otherwise
    base.set("attention.mode", "dense", "generate's default for an HF directory");
    for (const auto& s : sets) base.set(s.substr(0, s.find('=')), s.substr(s.find('=') + 1), "--set " + s);
    HfImport im = import_hf(path, base, sets);
    Loaded L{im.cfg, Model<float>(model_dims(im.cfg, 0)), "", {}};
    L.model.weights() = std::move(im.weights);
    if (fs::exists(fs::path(path) / "tokenizer.json")) L.tokenizer = (fs::path(path) / "tokenizer.json").string();
    eos_ids_of(fs::path(path) / "config.json", L.stop);
    eos_ids_of(fs::path(path) / "generation_config.json", L.stop);
    return L;
  }
  Checkpoint ck = read_checkpoint(path);
  Config cfg = Config::from_text(ck.config_toml, path + " (stored config)");
  cfg.set("train.device", "cpu", "generate's default (the run's device is not where it generates)");
  for (const auto& s : sets) cfg.set(s.substr(0, s.find('=')), s.substr(s.find('=') + 1), "--set " + s);
  int64_t vocab = 0;  // a run that took its vocabulary from the data stored 0: the embedding's rows
  for (const auto& t : ck.tensors)
    if (t.name == "model.embed_tokens.weight" && !t.shape.empty()) vocab = t.shape[0];
  Loaded L{cfg, Model<float>(model_dims(cfg, vocab)), "", {}};
  load_weights(ck, path, L.model);
  const std::string tok = cfg.s("prep.tokenizer");  // the run's recorded tokenizer, if it still exists
  if (!tok.empty() && fs::exists(tok)) L.tokenizer = tok;
  return L;
}

// The end token of a chat template's turns (<|im_end|>, <|eot_id|>): generation stops there too.
static const char* turn_end(ChatFamily f) {
  return f == ChatFamily::ChatML ? "<|im_end|>" : f == ChatFamily::Llama3 ? "<|eot_id|>" : nullptr;
}

static int run_generate(const Args& args) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) throw Error("generate runs on one rank (got " + std::to_string(size) + "); start it without mpirun -np");
  if (args.positional.size() != 1)
    throw Error("generate: expected one MODEL (a checkpoint .h5 or an HF model directory), got " +
                std::to_string(args.positional.size()) + " argument(s)");
  if (args.has("prompt") == args.has("ids")) throw Error("generate: give the prompt as --prompt TEXT or as --ids 1,2,3 (one of them)");
  if (args.has("chat") && args.has("ids")) throw Error("--chat renders --prompt TEXT; with --ids the ids are the whole prompt");
  Loaded L = load_model(args.positional[0], args.sets);
  const ModelDims& dims = L.model.shape();
  GenerateOptions o;
  o.max_new = int(args.has("max-new-tokens") ? args.integer("max-new-tokens", 1, 1 << 20, "tokens to generate") : 64);
  o.seed = uint64_t(args.has("seed") ? args.integer("seed", 0, INT64_MAX, "the sampling seed") : 0);
  auto real = [&](const char* flag, double def, double lo, double hi) {
    if (!args.has(flag)) return def;
    const std::string t = args.get(flag);
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || *end || !(v >= lo && v <= hi))
      throw Error(std::string("--") + flag + " '" + t + "': expected a number from " + (std::ostringstream() << lo).str() +
                  " to " + (std::ostringstream() << hi).str());
    return v;
  };
  o.temperature = real("temperature", 0, 0, 100);
  o.top_p = real("top-p", 1, 1e-6, 1);
  const std::string attention = L.cfg.s("attention.mode");  // dense | sparse (the schema checks it)

  // The tokenizer: --tokenizer, else the model's (HF directory, or the run's prep.tokenizer), else bytes.
  const std::string tok_path = args.get("tokenizer", L.tokenizer);
  std::optional<BpeTokenizer> bpe;
  if (!tok_path.empty()) bpe = BpeTokenizer::load(tok_path);
  const bool bytes = !bpe && dims.vocab == ByteTokenizer::kVocabSize;
  std::vector<int32_t> prompt;
  ChatTemplate tpl;
  if (args.has("ids")) {
    prompt = parse_ids(args.get("ids"), "--ids");
  } else {
    if (!bpe && !bytes)
      throw Error("--prompt needs a tokenizer: this model has " + std::to_string(dims.vocab) + " tokens, not the byte "
                  "vocabulary (259); give --tokenizer tokenizer.json, or the prompt's ids with --ids");
    std::string text = args.get("prompt");
    if (args.has("chat")) {  // one user turn and the assistant's header, as apply_chat_template(add_generation_prompt=True)
      tpl = choose_chat_template("auto", bpe ? tok_path : "");
      if (!tpl.error.empty()) throw Error("--chat: " + tpl.error);
      text.clear();
      ChatMessage user;
      user.role = "user", user.content = args.get("prompt");
      for (const TextPiece& p : render_chat(tpl, {user}, true, "--prompt")) text += p.text;
    }
    std::vector<uint32_t> ids = bpe ? bpe->encode(text) : ByteTokenizer::encode(text);
    prompt.assign(ids.begin(), ids.end());
  }
  if (prompt.empty()) throw Error("--prompt '': no tokens to continue (give some text)");
  for (int32_t id : prompt)
    if (id >= dims.vocab)
      throw Error("prompt token id " + std::to_string(id) + " is outside the model's vocabulary (" +
                  std::to_string(dims.vocab) + " tokens)");
  // Where it stops: --stop-id, else the model's end ids (config.json / generation_config.json, the
  // tokenizer's EOS, the byte EOS) and, with --chat, the template's end of turn.
  if (args.has("stop-id")) {
    o.stop = parse_ids(args.get("stop-id"), "--stop-id");
  } else {
    o.stop = L.stop;
    if (bpe && o.stop.empty()) {
      try {
        o.stop.push_back(int32_t(bpe->eos_id()));
      } catch (const std::exception&) {  // a tokenizer without an EOS: max-new-tokens alone ends it
      }
    }
    if (bytes) o.stop.push_back(int32_t(ByteTokenizer::kEos));
    if (const char* end = bpe ? turn_end(tpl.family) : nullptr)
      if (auto id = bpe->token_id(end)) o.stop.push_back(int32_t(*id));
  }

  const Settings st = from_config(L.cfg, dims.vocab);
  const AttnSettings attn = attention == "sparse" ? st.attention.at_k0(dims.n_layers, st.balance.dst.k0)
                                                  : [&] { AttnSettings a = st.attention.at_k0(dims.n_layers, 1);
                                                          a.sparse = false;
                                                          return a; }();
  // train.device=cuda: ModelCuda's forward per token (its greedy prediction; no KV cache there).
  const bool gpu = L.cfg.s("train.device") == "cuda";
#ifndef SB_WITH_CUDA
  if (gpu)
    throw Error("--set train.device=cuda: this sparsebalance was built without CUDA (-DSB_CUDA=OFF); "
                "generate on the CPU (train.device=cpu, the default) or use a CUDA build");
#endif
  if (gpu && o.temperature > 0)
    throw Error("--temperature " + args.get("temperature") + " with --set train.device=cuda: the GPU generates greedily "
                "(--temperature 0) only; sample on the CPU (train.device=cpu)");
  // Dense on the CPU: the KV cache. Sparse: the full forward per token (the gate needs whole blocks).
  Decoder<float> dec(L.model);
  NextLogits next = [&](const std::vector<int32_t>& seq, int fresh) {
    std::vector<float> logits;
    if (!attn.sparse) {
      logits = dec.append(std::span(seq).last(size_t(fresh)));
    } else {
      PackedBatch b;
      b.add(std::vector<uint32_t>(seq.begin(), seq.end()));
      logits = L.model.forward_logits(b, attn, b.n() - 1);
    }
    for (float x : logits)  // a NaN or inf would pick token 0 forever, silently
      if (!std::isfinite(x))
        throw Error(args.positional[0] + ": the model's logits are not finite after " + std::to_string(seq.size()) +
                    " tokens (non-finite weights or activations)");
    return logits;
  };
  Generated g;
#ifdef SB_WITH_CUDA
  if (gpu) {  // greedy through ModelCuda's forward per token (no KV cache on the GPU; logprobs unknown)
    ModelCuda mc(dims, L.model.layout());
    mc.upload_weights(L.model.weights());
    std::vector<int32_t> seq = prompt, argmax;
    for (int t = 0; t < o.max_new; ++t) {
      PackedBatch b;
      b.add(std::vector<uint32_t>(seq.begin(), seq.end()));
      mc.forward(b, attn, &argmax);
      g.ids.push_back(argmax.back()), seq.push_back(argmax.back());
      if (std::find(o.stop.begin(), o.stop.end(), argmax.back()) != o.stop.end()) {
        g.stopped = true;
        break;
      }
    }
  }
#endif
  if (!gpu) g = generate(prompt, next, o);

  std::vector<uint32_t> shown(g.ids.begin(), g.ids.end() - (g.stopped ? 1 : 0));  // the text without its end token
  const std::string text = bpe ? bpe->decode(shown) : bytes ? ByteTokenizer::decode(shown) : "";
  if (args.has("json")) {
    json j = {{"model", args.positional[0]}, {"prompt_ids", prompt}, {"ids", g.ids}, {"text", text},
              {"stopped", g.stopped}, {"attention", attention}, {"device", gpu ? "cuda" : "cpu"},
              {"temperature", o.temperature}, {"top_p", o.top_p}, {"seed", o.seed}};
    j["logprobs"] = gpu ? json(nullptr) : json(g.logprobs);
    std::printf("%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());  // bytes not UTF-8: U+FFFD
  } else if (bpe || bytes) {
    std::fwrite(text.data(), 1, text.size(), stdout);  // the bytes as they are, NULs included
    std::fputc('\n', stdout);
  } else {  // no tokenizer: the ids
    for (size_t i = 0; i < g.ids.size(); ++i) std::printf("%s%d", i ? "," : "", g.ids[i]);
    std::printf("\n");
  }
  return 0;
}

Command cmd_generate() {
  return {"generate",
          "continue a prompt with a checkpoint or an HF model (greedy or sampled)",
          "generate MODEL (--prompt TEXT [--chat] | --ids 1,2,3) [--max-new-tokens N] [--temperature T]\n"
          "        [--top-p P] [--seed S] [--tokenizer tokenizer.json] [--stop-id 1,2] [--json]\n"
          "        [--set key=value]...\n\n"
          "MODEL a checkpoint .h5 or an HF directory (config.json + safetensors, as convert reads it).\n"
          "The prompt goes through --tokenizer (default: tokenizer.json in the HF directory, or the\n"
          "checkpoint's prep.tokenizer when that file exists; the byte vocabulary for 259-token models),\n"
          "encoded without special tokens; --chat renders it as one user message with the model's chat\n"
          "template (tokenizer_config.json beside the tokenizer) and the assistant's header. Greedy by\n"
          "default (--temperature 0); else softmax(logits / T) cut to the --top-p nucleus, from --seed.\n"
          "Stops after --max-new-tokens (64) or at an end id: --stop-id, else eos_token_id of config.json\n"
          "and generation_config.json (else the tokenizer's EOS) and, with --chat, the turn's end token.\n"
          "Prints the continuation's text (without the end token; the ids when there is no tokenizer);\n"
          "--json prints {prompt_ids, ids, logprobs, text, stopped, ...} instead.\n"
          "Attention is attention.mode: a checkpoint's stored one, dense for an HF directory; change it\n"
          "with --set attention.mode=dense|sparse (sparse takes the stored attention.* and balance.dst.k0).\n"
          "Dense on the CPU runs with a KV cache; sparse runs the whole forward per token (the gate pools\n"
          "whole blocks). The CPU by default; --set train.device=cuda generates on the GPU (a CUDA build):\n"
          "greedy only, the whole forward per token, no logprobs.\n",
          {{"prompt", 1, "the text to continue", "TEXT"},
           {"ids", 1, "the prompt as token ids (byte or no-tokenizer models)", "1,2,3"},
           {"chat", 0, "render --prompt as a user message with the model's chat template, generation prompt added"},
           {"tokenizer", 1, "tokenizer.json for --prompt and the output (default: the model's)", "PATH"},
           {"max-new-tokens", 1, "tokens generated at most (default 64)", "N"},
           {"temperature", 1, "0: greedy (default); else sampling temperature", "T"},
           {"top-p", 1, "sampling: keep the likeliest tokens whose probability reaches P (default 1)", "P"},
           {"seed", 1, "sampling seed (default 0)", "S"},
           {"stop-id", 1, "end ids instead of the model's", "1,2"},
           {"json", 0, "print JSON with the ids and per-token logprobs instead of the text"}},
          run_generate, kSetFlag};
}

}  // namespace sb
