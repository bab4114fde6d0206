#!/usr/bin/env python3
"""A random Hugging Face model of a published shape, for bench/torch/hf_finetune.sh (issues 19, 51).

    python3 bench/torch/hf_random_model.py MODEL OUT_DIR [--tiny]
    python3 bench/torch/hf_random_model.py --compare IN_DIR EXPORTED_DIR

MODEL: qwen2.5-0.5b | qwen3-0.6b | llama3.2-1b. OUT_DIR gets the model's config.json as the Hub
serves it (transformers 4 fields: `rope_theta` and `rope_scaling` at the top; Llama 3.2's llama3
scaling, Qwen3's head_dim 128 beside 1024 / 16 heads) and bf16 weights, no weights being fetchable:
- with transformers (the GPU machine): AutoConfig.from_pretrained(OUT_DIR), so each version reads
  the published file its own way (5.x moves the RoPE fields into `rope_parameters`);
  AutoModelForCausalLM.from_config on the GPU; save_pretrained (config.json is then that version's);
- without it (the CPU machine): numpy normal(0, initializer_range) weights in safetensors
  (tests/convert/make_fixtures.py's writer), the published config.json as is.
Either way norm weights are 1 + 0.1 N(0, 1) and biases 0.1 N(0, 1): at 1 and 0 a lost norm (Qwen3's
q_norm / k_norm) or bias (Qwen2's) would not show in the reload's loss.
--tiny: the same family and fields at toy dims (2 layers, d_model 64, 4 / 2 heads, vocab 320 >= the
byte vocabulary of `prep synth`; Qwen3's head_dim 32 beside 64 / 4; Llama's scaling over an original
context of 64), for the whole flow on the CPU in seconds (TINY=1 bash bench/torch/hf_finetune.sh).
--compare: the model an export describes against the input's: the config.json fields that shape the
forward, read as transformers 4 or 5 writes them (RoPE under rope_scaling or rope_parameters), and
the tensors' names, dtypes and shapes (safetensors headers); exit status 1 on a difference.
"""
import json
import os
import sys
import time

QWEN25 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
          "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
          "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
          "max_window_layers": 24, "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
          "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
          "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
         "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
         "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
         "max_position_embeddings": 40960, "max_window_layers": 28, "num_attention_heads": 16,
         "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
         "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
         "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
LLAMA32 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
           "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64,
           "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
           "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32,
           "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
           "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
           "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
           "vocab_size": 128256}
MODELS = {"qwen2.5-0.5b": QWEN25, "qwen3-0.6b": QWEN3, "llama3.2-1b": LLAMA32}
# Parameter counts of the published models (the checks of tests/convert/test_safetensors.cpp).
PARAMS = {"qwen2.5-0.5b": 494032768, "qwen3-0.6b": 596049920, "llama3.2-1b": 1235814400}


def config(name, tiny):
    c = json.loads(json.dumps(MODELS[name]))  # a copy
    if tiny:
        c.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, bos_token_id=1, eos_token_id=2, max_position_embeddings=2048)
        if "head_dim" in c:
            c["head_dim"] = 32 if c["model_type"] == "qwen3" else 16
        if "max_window_layers" in c:
            c["max_window_layers"] = 2
        if c.get("rope_scaling"):
            c["rope_scaling"]["original_max_position_embeddings"] = 64
    return c


def shapes(c):
    """(name, shape) of every tensor, as transformers names them."""
    C, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or C // H
    bias, qk_norm = c["model_type"] == "qwen2", c["model_type"] == "qwen3"
    out = [("model.embed_tokens.weight", (V, C))]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out.append((p + "input_layernorm.weight", (C,)))
        for proj, rows in (("q", H * D), ("k", Hkv * D), ("v", Hkv * D)):
            out.append((p + f"self_attn.{proj}_proj.weight", (rows, C)))
            if bias:
                out.append((p + f"self_attn.{proj}_proj.bias", (rows,)))
        if qk_norm:
            out += [(p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,))]
        out += [(p + "self_attn.o_proj.weight", (C, H * D)), (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F))]
    out.append(("model.norm.weight", (C,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def with_transformers(out, seed):
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    kw = {"dtype": torch.bfloat16} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.bfloat16}
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # the init on the CPU took 30 s at 0.5B
        m = AutoModelForCausalLM.from_config(cfg, **kw)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    m.save_pretrained(out, safe_serialization=True)
    return f"transformers {transformers.__version__} ({type(m).__name__})", sum(p.numel() for p in m.parameters())


def with_numpy(out, c, seed):
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "convert"))
    from make_fixtures import raw, write_st  # noqa: E402  (the project's numpy safetensors writer)
    rng = np.random.default_rng(seed)
    ts, n = [], 0
    for name, shape in shapes(c):
        if name.endswith(".bias"):
            v = 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif "norm" in name:
            v = 1 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            v = c["initializer_range"] * rng.standard_normal(shape, dtype=np.float32)
        ts.append((name, "BF16", shape, raw(v, "BF16")))
        n += v.size
    write_st(os.path.join(out, "model.safetensors"), ts)
    return "numpy (no transformers here)", n


def forward_fields(d):
    """The config.json fields that shape the forward, in one form whatever the version wrote."""
    c = json.load(open(os.path.join(d, "config.json")))
    r = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    theta = r.pop("rope_theta", c.get("rope_theta", 10000.0))
    kind = r.pop("rope_type", r.pop("type", "default"))
    keys = ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "tie_word_embeddings", "rms_norm_eps")
    out = {k: c.get(k) for k in keys}
    out.update(head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], rope_theta=float(theta),
               rope_type=kind, rope={k: float(v) for k, v in r.items() if isinstance(v, (int, float))})
    return out


def tensors(d):
    """{name: (dtype, shape)} over the directory's safetensors files."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                h = json.loads(fh.read(n))
            out.update({k: (v["dtype"], v["shape"]) for k, v in h.items() if k != "__metadata__"})
    return out


def compare(a, b):
    fa, fb = forward_fields(a), forward_fields(b)
    ra, rb = fa.pop("rope"), fb.pop("rope")  # a key only one side writes (a version's default) is no difference
    bad = [f"{k}: {fa[k]} -> {fb[k]}" for k in fa if fa[k] != fb[k]]
    bad += [f"rope {k}: {ra[k]} -> {rb[k]}" for k in set(ra) & set(rb) if ra[k] != rb[k]]
    ta, tb = tensors(a), tensors(b)
    bad += [f"tensor {k}: {ta.get(k)} -> {tb.get(k)}" for k in sorted(set(ta) | set(tb)) if ta.get(k) != tb.get(k)]
    if bad:
        sys.exit(f"{b} describes another model than {a}:\n  " + "\n  ".join(bad[:20]))
    print(f"{b}: the forward's config.json fields ({fa['architectures'][0]}, head_dim {fa['head_dim']}, RoPE "
          f"{fa['rope_type']} theta {fa['rope_theta']:g} {ra}) and {len(tb)} tensors as {a}'s")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        return compare(sys.argv[2], sys.argv[3])
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2 or args[0] not in MODELS or any(a not in ("--tiny",) for a in sys.argv[1:] if a.startswith("--")):
        sys.exit(f"usage: hf_random_model.py {{{'|'.join(MODELS)}}} OUT_DIR [--tiny]")
    name, out = args
    tiny = "--tiny" in sys.argv
    t0 = time.time()
    c = config(name, tiny)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    try:
        import transformers  # noqa: F401
        how, n = with_transformers(out, 0)
    except ImportError:
        how, n = with_numpy(out, c, 0)
    if not tiny and n != PARAMS[name]:  # the conversion checks every tensor's shape; this says it early
        print(f"WARNING: {name}: {n} parameters, the published model has {PARAMS[name]}", file=sys.stderr)
    print(f"random {name}{' (tiny)' if tiny else ''}-shaped model by {how}: {n:,} parameters, saved in "
          f"{time.time() - t0:.1f} s to {out}")


if __name__ == "__main__":
    main()
