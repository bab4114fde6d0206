#!/usr/bin/env python3
"""Golden fixtures for the weight converter (tests/convert), made with Hugging Face transformers.

    python3 bench/torch/hf_parity.py --out DIR [--check EXPORTED_DIR ...] [--tar]

Builds tiny random models with from_config + save_pretrained (float32 safetensors) and computes
their logits on fixed token ids on the CPU in float32 with eager attention, so the numbers do not
depend on the GPU's TF32 or fused kernels:

    DIR/llama/    LlamaForCausalLM, untied head, rope_theta 50000, rms_norm_eps 1e-6, GQA 4/2
    DIR/mistral/  MistralForCausalLM, tied head, sliding_window null
    DIR/qwen2/    Qwen2ForCausalLM, tied, q/k/v biases (random, as the norms)
    each with config.json, model.safetensors and golden.json:
      {"ids": [[...], ...], "logits": [[[V floats] x T] per sequence], "transformers": version}

--check loads directories that `sparsebalance convert CKPT DIR` exported, with
from_pretrained(output_loading_info=True): every missing/unexpected/mismatched key is an error,
and the logits on the same ids go to DIR/check_<name>.json for the CPU test to compare with ours.
--tar packs everything into DIR/fixtures.tar (the device tool returns only a few files per run).
Needs torch, transformers, safetensors (the GPU machine has them). Takes a few seconds.
"""
import argparse
import json
import os
import sys
import tarfile
import traceback

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

IDS = [[1, 17, 42, 5, 88, 3, 3, 61, 29, 90, 14, 7], [70, 2, 33, 95, 11, 0, 58]]
COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              hidden_act="silu", initializer_range=0.2)
# transformers 5 renamed torch_dtype to dtype
F32 = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}


def logits_of(model):
    out = []
    with torch.no_grad():
        for ids in IDS:
            x = torch.tensor([ids], dtype=torch.long)
            out.append(model(input_ids=x).logits[0].float().tolist())
    return out


def make(out, name, cfg):
    torch.manual_seed({"llama": 1, "mistral": 2, "qwen2": 3}[name])
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", **F32)
    model.eval()
    # Norm weights at 1 would hide a swapped norm: make them random too.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in n else 0.3 * torch.randn_like(p))
    d = os.path.join(out, name)
    model.save_pretrained(d, safe_serialization=True)
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump({"ids": IDS, "logits": logits_of(model), "transformers": transformers.__version__}, f)
    print(f"{name}: {sum(p.numel() for p in model.parameters())} params -> {d}")


def check(out, d):
    model, info = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", output_loading_info=True, **F32)
    bad = {k: v for k, v in info.items() if v}
    name = os.path.basename(os.path.normpath(d))
    res = {"dir": d, "loading_info": {k: [str(x) for x in v] for k, v in info.items()},
           "config_class": type(model.config).__name__, "ok": not bad}
    if not bad:
        res["ids"] = IDS
        res["logits"] = logits_of(model.eval())
    with open(os.path.join(out, f"check_{name}.json"), "w") as f:
        json.dump(res, f)
    print(f"check {d}: {'ok' if not bad else 'FAILED ' + json.dumps(res['loading_info'])}")
    return not bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", nargs="*", default=[])
    ap.add_argument("--tar", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    print("transformers", transformers.__version__, "torch", torch.__version__)
    ok = True
    jobs = [lambda: make(a.out, "llama", LlamaConfig(**COMMON, tie_word_embeddings=False, rope_theta=50000.0,
                                                     rms_norm_eps=1e-6)),
            lambda: make(a.out, "mistral", MistralConfig(**COMMON, tie_word_embeddings=True, sliding_window=None)),
            lambda: make(a.out, "qwen2", Qwen2Config(**COMMON, tie_word_embeddings=True, use_sliding_window=False,
                                                     sliding_window=4096, max_window_layers=2))]
    jobs += [lambda d=d: check(a.out, d) for d in a.check]
    for job in jobs:  # one failure must not lose the other fixtures
        try:
            ok = job() is not False and ok
        except Exception:
            traceback.print_exc()
            ok = False
    if a.tar:
        with tarfile.open(os.path.join(a.out, "fixtures.tar"), "w") as t:
            for name in sorted(os.listdir(a.out)):
                if name != "fixtures.tar":
                    t.add(os.path.join(a.out, name), arcname=name)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
