#include "src/config/schema.hpp"

namespace sb {

std::vector<KeySpec> schema_data() {
  using T = KeyType;
  constexpr double BIG = kNoUpperBound;
  return {
      {"data.path", T::String, "runs/tiny/data", 0, 0, {}, "shard directory (or one shard file); or give data.sources instead, not both"},
      {"data.sources", T::Sources, "[]", 0, 0, {}, "a weighted mixture instead of data.path: [{ path = \"runs/long\", weight = 0.7 }, { path = \"runs/short\", weight = 0.3 }]; each global batch draws each document's source by weight (normalised), each source keeps its own data.val_fraction split and wraps to its next epoch when it runs out (src/data/README.md, \"Weighted mixtures\")"},
      {"data.seed", T::Int, "1234", 0, BIG, {}, "seed of the document shuffle (and of data.sources' draws)"},
      {"data.val_fraction", T::Float, "0.05", 0, 0.9, {}, "fraction of documents held out for validation"},
      {"data.long_docs", T::String, "window", 0, 0, {"window", "reject", "split"}, "documents longer than train.micro_batch_tokens: cut into windows, reject with an error, or split each into parts over ceil(length / micro_batch_tokens) ranks that compute its attention together (CPU and CUDA engines)", "", {{"shard", "split"}}},
      // [prep] `sparsebalance prep text|bin|synth`; each key also has a flag (--shard-tokens for prep.shard_tokens).
      {"prep.output", T::String, "", 0, 0, {}, "output directory of the shards (--output)"},
      {"prep.shard_tokens", T::Int, "16777216", 1, BIG, {}, "tokens per shard before a new one starts (whole documents)"},
      {"prep.overwrite", T::Bool, "false", 0, 0, {}, "replace *.h5 files already in the output directory"},
      {"prep.format", T::String, "text", 0, 0, {"text", "jsonl"}, "prep text: plain text, or JSONL with a \"text\" field per line"},
      {"prep.split", T::String, "blank-lines", 0, 0, {"blank-lines", "file", "jsonl"}, "prep text: documents end at runs of blank lines, or one per file (jsonl = --format jsonl)"},
      {"prep.eot", T::Int, "50256", 0, 65535, {}, "prep bin: end-of-text id separating documents (not stored)"},
      {"prep.vocab", T::Int, "50257", 1, 65536, {}, "prep bin: vocabulary size of the token files"},
      {"prep.preset", T::String, "longalign", 0, 0, {"longalign", "chatqa2", "uniform", "fixed"}, "prep synth: document length distribution"},
      {"prep.docs", T::Int, "1000", 1, BIG, {}, "prep synth: number of documents"},
      {"prep.seed", T::Int, "1", 0, BIG, {}, "prep synth: seed (same seed, same bytes)"},
      {"prep.max_len", T::Int, "8192", 1, BIG, {}, "prep synth: longest document in tokens (= bytes)"},
      {"prep.min_len", T::Int, "32", 1, BIG, {}, "prep synth: shortest document in tokens"},
      {"prep.ask", T::String, "one", 0, 0, {"one", "all"}, "prep synth: multi-key and key-value documents ask one key (the evaluated format) or every key, the evaluated one last (training documents with many answers; with --mask answers all are trained)"},
      {"prep.mask", T::String, "none", 0, 0, {"none", "answers"}, "prep synth: loss mask: none (every token trained) or answers (only the task answers)"},
      {"prep.dict", T::String, "/usr/share/dict/american-english", 0, 0, {}, "prep synth: word list of the filler text (package wamerican)"},
      {"prep.tokenizer", T::String, "", 0, 0, {}, "prep text: Hugging Face tokenizer.json (byte-level BPE); empty = the byte tokenizer"},
      {"prep.chat_template", T::String, "auto", 0, 0, {"auto", "chatml", "llama3", "plain"}, "prep text: how \"messages\" records are rendered: the model's own template (auto: recognised in tokenizer_config.json beside --tokenizer; plain without a tokenizer), ChatML (Qwen), Llama 3, or plain <|ROLE|> lines (src/data/README.md)"},
      {"prep.eos", T::String, "", 0, 0, {}, "prep text with a tokenizer: EOS token text; empty = tokenizer_config.json's eos_token"},
  };
}

}  // namespace sb
