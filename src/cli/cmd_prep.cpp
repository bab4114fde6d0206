// `sparsebalance prep text|bin|synth [CONFIG.toml]`: inputs -> token shards (src/data/README.md).
// Every flag is a [prep] config key, so a TOML [prep] section and --set prep.x=... work too;
// flags win over both. Rank 0 does all the work; other ranks wait (prep is single-rank work).
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "base/error.hpp"
#include "src/config/config.hpp"
#include "src/data/prep.hpp"

namespace sb {

namespace {

// flag -> config key; the flag's value becomes `--set key=value` after the user's own --set.
const std::vector<std::pair<std::string, std::string>> kFlagKeys = {
    {"output", "prep.output"},   {"shard-tokens", "prep.shard_tokens"}, {"format", "prep.format"},
    {"split", "prep.split"},     {"eot", "prep.eot"},                   {"vocab", "prep.vocab"},
    {"preset", "prep.preset"},   {"docs", "prep.docs"},                 {"seed", "prep.seed"},
    {"max-len", "prep.max_len"}, {"min-len", "prep.min_len"},           {"dict", "prep.dict"},
    {"tokenizer", "prep.tokenizer"}, {"eos", "prep.eos"}, {"chat-template", "prep.chat_template"}, {"chat-date", "prep.chat_date"}, {"mask", "prep.mask"}, {"ask", "prep.ask"},
};

Config load_config(const Args& args) {
  if (args.positional.empty() || args.positional.size() > 2)
    throw Error("sparsebalance prep: expected `prep text|bin|synth [CONFIG.toml]` (see sparsebalance prep --help)");
  std::vector<std::string> sets = args.sets;
  for (const auto& [flag, key] : kFlagKeys)
    if (args.has(flag)) sets.push_back(key + "=" + args.get(flag));
  if (args.has("overwrite")) sets.push_back("prep.overwrite=true");
  try {
    return Config::load(args.positional.size() == 2 ? args.positional[1] : "", sets);
  } catch (const Error& e) {
    // A bad flag value is reported as the flag the user typed, not as the --set it became.
    const std::string what = e.what();
    for (const auto& [flag, key] : kFlagKeys) {
      if (!args.has(flag)) continue;
      const std::string as_set = "--set " + key + "=" + args.get(flag) + ":";
      if (what.starts_with(as_set)) throw Error("--" + flag + " " + args.get(flag) + ":" + what.substr(as_set.size()));
    }
    throw;
  }
}

bool set_by_user(const Args& args, const std::string& key) {
  for (const auto& s : args.sets)
    if (s.starts_with(key + "=")) return true;
  return false;
}

bool json_name(const std::string& path) { return path.ends_with(".jsonl") || path.ends_with(".json"); }

// prep text's input format. Unless --format/--split (flag, --set or a config value other than the
// default) says otherwise, inputs named *.jsonl / *.json are read as JSONL: storing each raw JSON
// line as a document is never what was meant. Inputs that mix JSON and other names are refused.
std::string text_format(const Args& args, const Config& cfg, const std::vector<std::string>& inputs) {
  std::string format = cfg.s("prep.format");
  const bool told = args.has("format") || args.has("split") || set_by_user(args, "prep.format") ||
                    set_by_user(args, "prep.split") || format != "text" || cfg.s("prep.split") != "blank-lines";
  if (told) return format;
  size_t json = 0;
  for (const auto& in : inputs) json += json_name(in);
  if (json == 0) return format;
  if (json < inputs.size()) {
    const auto a = *std::find_if(inputs.begin(), inputs.end(), json_name);
    const auto b = *std::find_if_not(inputs.begin(), inputs.end(), json_name);
    throw Error("sparsebalance prep text: --input mixes JSON files (" + a + ") and other files (" + b +
                "): pass --format jsonl (a \"text\" field per line) or --format text (raw lines), "
                "or prep them separately");
  }
  std::printf("prep text: %s ends in .%s: reading it as --format jsonl (one JSON record per line; "
              "--format text keeps raw lines)\n",
              inputs[0].c_str(), inputs[0].ends_with(".json") ? "json" : "jsonl");
  return "jsonl";
}

int run(const Args& args) {
  Comm comm;
  Config cfg = load_config(args);  // every rank validates, so a typo fails the same everywhere
  const std::string mode = args.positional[0];
  if (mode != "text" && mode != "bin" && mode != "synth")
    throw Error("sparsebalance prep: unknown mode '" + mode + "', expected text, bin or synth");
  if (!comm.root()) {
    comm.barrier();
    return 0;
  }
  PrepOptions opt;
  opt.output = cfg.s("prep.output");
  opt.shard_tokens = uint64_t(cfg.i("prep.shard_tokens"));
  opt.overwrite = cfg.b("prep.overwrite");
  opt.mask = cfg.s("prep.mask");
  if (opt.output.empty()) throw Error("sparsebalance prep " + mode + ": --output DIR is required (or prep.output)");
  const auto& inputs = args.all("input");
  if (mode != "synth" && inputs.empty())
    throw Error("sparsebalance prep " + mode + ": --input FILE... is required");

  PrepStats st;
  if (mode == "text") {
    std::string split = cfg.s("prep.split"), format = text_format(args, cfg, inputs);
    if (split == "jsonl") format = "jsonl";
    opt.tokenizer = cfg.s("prep.tokenizer");
    opt.eos = cfg.s("prep.eos");
    opt.chat_template = cfg.s("prep.chat_template");
    opt.chat_date = cfg.s("prep.chat_date");
    st = prep_text(inputs, format, split, opt);
  } else if (mode == "bin") {
    st = prep_bin(inputs, cfg.i("prep.eot"), cfg.i("prep.vocab"), opt);
  } else {
    SynthOptions so;
    so.preset = cfg.s("prep.preset");
    so.docs = uint64_t(cfg.i("prep.docs"));
    so.seed = uint64_t(cfg.i("prep.seed"));
    so.max_len = uint64_t(cfg.i("prep.max_len"));
    so.min_len = uint64_t(cfg.i("prep.min_len"));
    so.ask_all = cfg.s("prep.ask") == "all";
    so.dict = cfg.s("prep.dict");
    st = prep_synth(so, opt);
  }
  double tps = st.seconds > 0 ? double(st.tokens) / st.seconds : 0.0;
  std::printf("prep %s: %llu documents, %llu tokens, %llu shards -> %s in %.2f s (%.2f M tokens/s)\n", mode.c_str(),
              (unsigned long long)st.documents, (unsigned long long)st.tokens, (unsigned long long)st.shards,
              opt.output.c_str(), st.seconds, tps / 1e6);
  if (!st.chat_template.empty()) std::printf("prep %s: chat records rendered with %s\n", mode.c_str(), st.chat_template.c_str());
  if (args.has("summary"))
    write_summary(args.get("summary"), {{"command", "prep " + mode}, {"output", opt.output},
                                        {"documents", st.documents}, {"tokens", st.tokens},
                                        {"shards", st.shards}, {"files", st.files},
                                        {"seconds", st.seconds}, {"tokens_per_s", tps},
                                        {"chat_template", st.chat_template}});
  comm.barrier();
  return 0;
}

}  // namespace

Command cmd_prep() {
  return {"prep",
          "text, llm.c token files or a synthetic long-context corpus -> token shards",
          "prep text|bin|synth [CONFIG.toml] --output DIR [options]\n\n"
          "  prep text  --input FILE... [--format text|jsonl] [--split blank-lines|file]\n"
          "             [--tokenizer tokenizer.json [--eos TOKEN]] [--chat-template auto|chatml|llama3|plain]\n"
          "             [--chat-date \"DD Mon YYYY\"]\n"
          "      plain text (documents separated by blank lines, or one per file) or JSONL (per line\n"
          "      \"text\", \"prompt\"+\"response\" or chat \"messages\"; the last two train only the\n"
          "      response / assistant turns: /loss_mask); byte tokenizer (vocab 259, eos 257), or a\n"
          "      Hugging Face tokenizer.json (--tokenizer).\n"
          "      Without --format/--split, inputs named *.jsonl or *.json are read as --format jsonl.\n"
          "      --tokenizer: a Hugging Face byte-level BPE (GPT-2, Llama 3, Qwen2/2.5/3 tokenizer.json),\n"
          "      the ids of HF's encode(text, add_special_tokens=False); shards record its name and\n"
          "      sha256, vocab_size with added tokens and eos_id (--eos, else tokenizer_config.json's).\n"
          "      --chat-template: \"messages\" rendered as the model's own template renders them (auto:\n"
          "      the one in tokenizer_config.json beside --tokenizer; plain <|ROLE|> lines without one).\n"
          "      --chat-date: the \"Today Date:\" of Llama 3.1/3.2's system block (apply_chat_template's\n"
          "      date_string, e.g. \"26 Jul 2024\"); default: Llama 3.2 today (UTC), Llama 3.1 its fixed date.\n"
          "  prep bin   --input FILE... [--eot ID] [--vocab V]\n"
          "      llm.c token files (uint16, header magic 20240520); documents split at EOT (not stored).\n"
          "  prep synth [--preset longalign|chatqa2|uniform|fixed] [--docs N] [--seed S] [--max-len L]\n"
          "             [--min-len L] [--mask none|answers] [--ask one|all]\n"
          "      synthetic filler text with passkey, multi-key needle and key-value retrieval tasks\n"
          "      (question and answer at the end of each document, answer span stored); --mask answers\n"
          "      trains only the answers (/loss_mask); --ask all asks every key of the multi-key and\n"
          "      key-value documents (the stored span: the last, as with --ask one; training data).\n\n"
          "Shards are DIR/shard_00000.h5, ... of about --shard-tokens tokens (whole documents). Flags are\n"
          "the [prep] config keys (src/config/KEYS.md); flags override the file and --set.\n",
          {{"input", -1, "input files (text, jsonl or llm.c .bin)", "FILE"},
           {"output", 1, "output directory (prep.output)", "DIR"},
           {"shard-tokens", 1, "tokens per shard (prep.shard_tokens)", "N"},
           {"overwrite", 0, "replace *.h5 already in DIR (prep.overwrite)", ""},
           {"format", 1, "text: text or jsonl (prep.format)", "FMT"},
           {"split", 1, "text: blank-lines or file (prep.split)", "MODE"},
           {"eot", 1, "bin: end-of-text id (prep.eot)", "ID"},
           {"vocab", 1, "bin: vocabulary size (prep.vocab)", "V"},
           {"preset", 1, "synth: length preset (prep.preset)", "P"},
           {"docs", 1, "synth: documents (prep.docs)", "N"},
           {"seed", 1, "synth: seed (prep.seed)", "S"},
           {"max-len", 1, "synth: longest document, tokens (prep.max_len)", "L"},
           {"min-len", 1, "synth: shortest document, tokens (prep.min_len)", "L"},
           {"dict", 1, "synth: word list (prep.dict)", "FILE"},
           {"tokenizer", 1, "text: Hugging Face tokenizer.json (prep.tokenizer)", "FILE"},
           {"eos", 1, "text: EOS token with --tokenizer (prep.eos)", "TOKEN"},
           {"chat-template", 1, "text: chat template of \"messages\" records (prep.chat_template)", "auto|chatml|llama3|plain"},
           {"chat-date", 1, "text: date of a Llama 3.1/3.2 system block (prep.chat_date)", "\"DD Mon YYYY\""},
           {"mask", 1, "synth: loss mask none or answers (prep.mask)", "M"},
           {"ask", 1, "synth: multi-key / key-value documents ask one key or all (prep.ask)", "one|all"}},
          run};
}

}  // namespace sb
