#!/usr/bin/python3
"""RoPE-scaling and Qwen3 fixtures for tests/convert, from an independent plain-torch forward.

    /usr/bin/python3 bench/torch/hf_rope_reference.py --out tests/convert/fixtures      # write the fixtures
    /usr/bin/python3 bench/torch/hf_rope_reference.py --check tests/convert/fixtures    # recompute, compare

transformers is not on the CPU machine (Debian's python3-torch 1.13 is), so this file implements the
Llama / Qwen2 / Qwen3 forward and the three RoPE scalings as transformers' modeling_rope_utils
defines them (ROPE_INIT_FUNCTIONS: _compute_linear_scaling_rope_parameters, _compute_llama3_parameters,
_compute_yarn_parameters; transformers 5's reading: the explicit factor, attention_factor
0.1 ln(factor) + 1 when not given, beta_fast 32, beta_slow 1, truncated ramp bounds), in float64.
It writes, per fixture, a config.json in transformers' own format, model.safetensors (float32,
random weights including the norms and biases) and golden.json {"ids", "logits", "reference"}:

    llama31/     LlamaForCausalLM, rope_scaling {"rope_type": "llama3", factor 8, low 1, high 4,
                 original_max_position_embeddings 32} (the Llama 3.1 shape), untied, GQA 4/2
    qwen2_yarn/  Qwen2ForCausalLM, q/k/v biases, tied, rope_scaling {"type": "yarn", factor 4,
                 original_max_position_embeddings 32} (Qwen2.5's 128K recipe, old "type" key)
    qwen3/       Qwen3ForCausalLM, head_dim 16 with hidden_size 32 / 4 heads, q_norm / k_norm, no
                 biases, tied, rope_parameters {"rope_type": "linear", "factor": 2, "rope_theta"}
                 (transformers 5's field)

Sequences run to 56 tokens, past original_max_position_embeddings (32): the scaled frequencies
decide the logits. max_position_embeddings = factor * original everywhere, so every transformers
version computes the same YaRN factor (4.5x took max_position_embeddings / original instead).

On the GPU machine bench/torch/hf_parity.py --rope-check DIR loads these directories with transformers
itself and compares its logits with golden.json (bench/torch/hf_fixtures.sh runs it).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

IDS = [[1, 17, 42, 5, 88, 3, 3, 61, 29, 90, 14, 7, 33, 2, 71, 50, 8, 19, 64, 27, 44, 91, 12, 6, 38, 80, 55,
        23, 4, 67, 31, 10, 77, 49, 85, 16, 58, 21, 93, 36, 9, 62, 40, 74, 15, 52, 26, 87, 45, 13, 69, 30, 95,
        18, 57, 34],
       [70, 2, 33, 95, 11, 0, 58, 41, 22, 83, 60, 5, 39, 28, 66, 47, 1, 92, 24, 73, 35, 56, 14, 81, 3, 68, 43,
        20, 89, 32, 53, 11, 76, 25, 48]]

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, hidden_act="silu", initializer_range=0.2, rms_norm_eps=1e-6,
              attention_dropout=0.0, use_cache=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)

FIXTURES = {
    "llama31": dict(arch="LlamaForCausalLM", model_type="llama", seed=11, tied=False, qkv_bias=False, qk_norm=False,
                    extra=dict(rope_theta=50.0, max_position_embeddings=256, attention_bias=False, mlp_bias=False,
                               head_dim=8, pretraining_tp=1,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen2_yarn": dict(arch="Qwen2ForCausalLM", model_type="qwen2", seed=12, tied=True, qkv_bias=True, qk_norm=False,
                       extra=dict(rope_theta=500.0, max_position_embeddings=128, use_sliding_window=False,
                                  sliding_window=None, max_window_layers=2,
                                  rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen3": dict(arch="Qwen3ForCausalLM", model_type="qwen3", seed=13, tied=True, qkv_bias=False, qk_norm=True,
                  extra=dict(head_dim=16, max_position_embeddings=64, attention_bias=False, use_sliding_window=False,
                             sliding_window=None, max_window_layers=2,
                             layer_types=["full_attention", "full_attention"],
                             rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0})),
}


# ---- RoPE: (inv_freq (D/2), attention factor), transformers' formulas --------------------------------
def rope_of(cfg):
    """The scaling dict (rope_scaling or rope_parameters), theta, D -> (inv_freq float64, attention factor)."""
    H = cfg["num_attention_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    r = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = r.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = r.get("rope_type", r.get("type", "default"))
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    if kind == "default":
        return inv, 1.0
    factor = r["factor"]
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        old = r["original_max_position_embeddings"]
        lo, hi = r["low_freq_factor"], r["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        return torch.where(medium, blended, out), 1.0
    if kind == "yarn":
        orig = r.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        att = r.get("attention_factor")
        if att is None:
            att = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        fast, slow = r.get("beta_fast") or 32, r.get("beta_slow") or 1

        def dim_of(rot):
            return D * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

        low, high = dim_of(fast), dim_of(slow)
        if r.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, D - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extra_weight = 1 - ramp  # 1: keep (extrapolate), 0: divide by factor (interpolate)
        return inv / factor * (1 - extra_weight) + inv * extra_weight, att
    raise SystemExit(f"rope type {kind} not implemented here")


# ---- the forward ------------------------------------------------------------------------------
def forward(cfg, w, ids):
    """Logits (T, V) float64 of one sequence, as transformers' eager Llama / Qwen2 / Qwen3 computes them."""
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    qk_norm = cfg["model_type"] == "qwen3"
    inv, att = rope_of(cfg)
    T = len(ids)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]           # (T, D/2)
    cos = torch.cat([ang.cos()] * 2, -1) * att                                 # (T, D)
    sin = torch.cat([ang.sin()] * 2, -1) * att

    def rms(x, g):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(t):  # (h, T, D)
        t1, t2 = t[..., :D // 2], t[..., D // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]                       # (T, C)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj").view(T, H, D).transpose(0, 1)        # (H, T, D)
        k = lin(h, p + "self_attn.k_proj").view(T, Hkv, D).transpose(0, 1)      # (Hkv, T, D)
        v = lin(h, p + "self_attn.v_proj").view(T, Hkv, D).transpose(0, 1)
        if qk_norm:
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // Hkv, 0), v.repeat_interleave(H // Hkv, 0)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D) + mask, -1) @ v  # (H, T, D)
        x = x + lin(a.transpose(0, 1).reshape(T, H * D), p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = lin(h, p + "mlp.gate_proj"), lin(h, p + "mlp.up_proj")
        x = x + lin(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


# ---- weights and files ------------------------------------------------------------------------
def shapes(cfg, tied, qkv_bias, qk_norm):
    C, H, Hkv, F, V = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                         "intermediate_size", "vocab_size"))
    D = cfg.get("head_dim") or C // H
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.append((p + "input_layernorm.weight", (C,)))
        for proj, rows in (("q", H * D), ("k", Hkv * D), ("v", Hkv * D)):
            out.append((p + f"self_attn.{proj}_proj.weight", (rows, C)))
            if qkv_bias:
                out.append((p + f"self_attn.{proj}_proj.bias", (rows,)))
        out.append((p + "self_attn.o_proj.weight", (C, H * D)))
        if qk_norm:
            out += [(p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,))]
        out += [(p + "post_attention_layernorm.weight", (C,)), (p + "mlp.gate_proj.weight", (F, C)),
                (p + "mlp.up_proj.weight", (F, C)), (p + "mlp.down_proj.weight", (C, F))]
    out.append(("model.norm.weight", (C,)))
    if not tied:
        out.append(("lm_head.weight", (V, C)))
    return out


def write_safetensors(path, tensors):
    """tensors: {name: float32 numpy array}, sorted by name as save_pretrained writes them."""
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", name
        a, b = t["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"])
        out[name] = torch.from_numpy(arr.astype(np.float64))
    return out


def make(out, name, spec):
    cfg = dict(architectures=[spec["arch"]], model_type=spec["model_type"], tie_word_embeddings=spec["tied"],
               torch_dtype="float32", **COMMON, **spec["extra"])
    gen = torch.Generator().manual_seed(spec["seed"])
    w = {}
    for n, shape in shapes(cfg, spec["tied"], spec["qkv_bias"], spec["qk_norm"]):
        r = torch.randn(shape, generator=gen, dtype=torch.float64)
        # norms random around 1 and biases random: a swapped or missing one shows in the logits
        t = 1.0 + 0.3 * r if "norm" in n else 0.3 * r if n.endswith(".bias") else cfg["initializer_range"] * r
        w[n] = t.to(torch.float32).numpy()
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    return golden_of(d)


def golden_of(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = read_safetensors(os.path.join(d, "model.safetensors"))
    logits = [forward(cfg, w, ids).tolist() for ids in IDS]
    return {"ids": IDS, "logits": logits, "reference": "bench/torch/hf_rope_reference.py (plain torch, float64)",
            "rope": {"inv_freq": rope_of(cfg)[0].tolist(), "attention_factor": rope_of(cfg)[1]}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write the fixtures under this directory")
    ap.add_argument("--check", help="recompute the logits of the committed fixtures and compare")
    a = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    if a.out:
        for name, spec in FIXTURES.items():
            g = make(a.out, name, spec)
            with open(os.path.join(a.out, name, "golden.json"), "w") as f:
                json.dump(g, f)
            print(f"{name}: inv_freq {['%.4g' % x for x in g['rope']['inv_freq']]} attention factor "
                  f"{g['rope']['attention_factor']:.6f}")
    if a.check:
        worst = 0.0
        for name in FIXTURES:
            d = os.path.join(a.check, name)
            old, new = json.load(open(os.path.join(d, "golden.json"))), golden_of(d)
            err = max(abs(x - y) for s0, s1 in zip(old["logits"], new["logits"]) for r0, r1 in zip(s0, s1)
                      for x, y in zip(r0, r1))
            print(f"{name}: max |logit - committed| = {err:.2e}")
            worst = max(worst, err)
        if worst > 1e-9:
            sys.exit("check: FAILED")


if __name__ == "__main__":
    main()
