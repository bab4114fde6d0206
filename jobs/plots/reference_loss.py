#!/usr/bin/python3
"""Recompute a checkpoint's dense validation loss with a plain NumPy re-implementation of the
model (Hugging Face Llama conventions) and compare it with `sparsebalance eval`.

    sparsebalance eval --checkpoint CKPT --summary eval.json
    /usr/bin/python3 jobs/plots/reference_loss.py CKPT eval.json [--tol 1e-4]

Reads the parameters by their Hugging Face names from /params, the model shape from the stored
config, the evaluated documents (doc_ids, window) from eval.json and their tokens from the
shards; exits 1 when the losses differ by more than --tol (relative)."""
import argparse, glob, json, os, sys, tomllib

import h5py
import numpy as np


def load_docs(path):
    files = sorted(glob.glob(os.path.join(path, "*.h5"))) if os.path.isdir(path) else [path]
    docs = []
    for fn in files:
        with h5py.File(fn, "r") as f:
            toks, offs = f["tokens"][:], f["doc_offsets"][:]
            docs += [toks[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
    return docs


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, theta):  # x (L, h, D), rotate-half convention
    L, _, D = x.shape
    inv = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.arange(L)[:, None] * inv[None, :]
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1)[:, None], np.concatenate([np.sin(ang)] * 2, -1)[:, None]
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


def loss_of(tokens, P, m):
    C, H, Hkv, L = m["d_model"], m["n_heads"], m["n_kv_heads"], len(tokens)
    D, eps = C // H, m["norm_eps"]
    x = P["model.embed_tokens.weight"][tokens]
    mask = np.triu(np.full((L, L), -np.inf), 1)
    for l in range(m["n_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
        q = rope((h @ P[p + "self_attn.q_proj.weight"].T).reshape(L, H, D), m["rope_theta"])
        k = rope((h @ P[p + "self_attn.k_proj.weight"].T).reshape(L, Hkv, D), m["rope_theta"])
        v = (h @ P[p + "self_attn.v_proj.weight"].T).reshape(L, Hkv, D)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)  # GQA
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", a, v).reshape(L, H * D) @ P[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ P[p + "mlp.gate_proj.weight"].T, h @ P[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ P[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, P["model.norm.weight"], eps)
    logits = x @ P.get("lm_head.weight", P["model.embed_tokens.weight"]).T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -logp[np.arange(L - 1), tokens[1:]].sum(), L - 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint"), ap.add_argument("eval_json")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    with h5py.File(a.checkpoint, "r") as f:
        P = {k: v[()].astype(np.float64) for k, v in f["params"].items()}
        cfg = f["config"][()]
    cfg = tomllib.loads(cfg.decode() if isinstance(cfg, bytes) else cfg)
    ev = json.load(open(a.eval_json))
    docs = load_docs(ev["data"])
    total, n = 0.0, 0
    for d in ev["doc_ids"]:
        t = docs[d][-ev["window"]:].astype(np.int64)
        if len(t) < 2:
            continue
        s, c = loss_of(t, P, cfg["model"])
        total, n = total + s, n + c
    ref = total / n
    err = abs(ref - ev["loss"]) / abs(ref)
    print(f"reference loss {ref:.6f}  sparsebalance eval {ev['loss']:.6f}  relative difference {err:.2e}")
    sys.exit(0 if err <= a.tol else 1)


if __name__ == "__main__":
    main()
