#!/usr/bin/python3
"""Greedy goldens of `sparsebalance generate` from transformers itself (run where torch and
transformers are installed, e.g. the GPU machine; the CPU is enough):
    python3 tests/convert/make_generate_golden.py && git diff tests/convert/fixtures/generate_golden.json
Each committed fixture (tests/convert/fixtures/NAME) is loaded by AutoModelForCausalLM in float32
and continued from the golden's prompt with generate(do_sample=False), stopping at its stop ids
(config.json's eos_token_id) as generate does. The file's ids are replaced and its "source" names
transformers; tests/convert/test_generate.cpp then checks generate against transformers' ids.
"""
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "generate_golden.json")


def main():
    g = json.load(open(PATH))
    for name, case in g["cases"].items():
        model = AutoModelForCausalLM.from_pretrained(os.path.join(HERE, "fixtures", name), torch_dtype=torch.float32)
        model.eval()
        prompt = torch.tensor([case["prompt_ids"]])
        stop = case["stop_ids"]
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=case["max_new_tokens"], eos_token_id=stop or None, pad_token_id=0,
                                 temperature=None, top_p=None, top_k=None)
        ids = out[0, prompt.shape[1]:].tolist()
        if case["ids"] != ids:
            print(f"{name}: the committed ids {case['ids']} differ from transformers' {ids}")
        case["ids"] = ids
    g["source"] = f"transformers {transformers.__version__} generate(do_sample=False), float32, torch {torch.__version__}"
    with open(PATH, "w") as f:
        json.dump(g, f, indent=1)
    print("wrote", PATH)


if __name__ == "__main__":
    main()
