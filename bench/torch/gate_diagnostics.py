#!/usr/bin/env python3
"""Where sparse attention loses retrieval: the gate diagnostics of issue 48, in PyTorch, on a model
exported by `sparsebalance convert` (a Hugging Face directory) and task documents of `prep synth`.

    python3 bench/torch/gate_diagnostics.py --model HF_DIR --data SHARD_DIR [--min-len 8193] [--max-len 16384]
        [--docs 96] [--block 64] [--k 16] [--local 1] [--theta 8] [--modes all] [--out DIR]
        [--engine transformers|builtin] [--budget-s S]
    python3 bench/torch/gate_diagnostics.py --selftest tests/convert/fixtures

An independent re-implementation of the project's gate (kernels/cpu/gating.cpp: pooled scores per KV
head, anchors = sink + diagonal + `local` blocks before it, candidates within theta of the best anchor,
the best k of them) as a transformers attention function, so every choice below runs on the same
model and documents without rebuilding anything:

  dense             every causal block
  sparse            the gate as built: mean(q_i) . mean(k_j)
  oracle            the gate, with the needle's key block(s) forced into every later row (same k)
  q=max|k=...       query side: max over the query block's tokens of q_t . summary_j (MoBA-style);
                    key side: mean, bounds (Quest: sum_d max(q_d kmax_d, q_d kmin_d)), sub4 (4 sub-block
                    means, the best of them)
  k=N               the gate as built at another budget
  dense@l / sparse@l  one layer dense (the others sparse) / one layer sparse (the others dense)

Per document it reads exact match of the last (evaluated) answer: greedy, teacher-forced, every
answer token right, as `sparsebalance eval` scores it. For the answer rows (the query positions that
predict the answer) it records, per layer and KV head, where the needle's block ranks in the gate's
order among the candidates, whether it was kept, the gate's own recall estimate (its softmax over
pooled scores, summed over kept blocks) and the true recall (the dense attention's softmax mass on
the kept blocks). The needle: the earliest occurrence of the answer's tokens in the document.

Writes DIR/diagnostics.json and prints Markdown tables. Needs torch, and transformers unless
--engine builtin (this file's plain Llama/Qwen2 forward, checked against transformers' logits by
--selftest on tests/convert/fixtures); reads the shards with h5py, or through libhdf5 by ctypes where
h5py is missing.
"""
import argparse
import ctypes
import ctypes.util
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


# ---- shards (io/README.md: /tokens, /doc_offsets, /task_type, /answer_spans) ----
def read_datasets(path, names):
    try:
        import h5py
        with h5py.File(path, "r") as f:
            return {n: (np.asarray(f[n]) if n in f else None) for n in names}
    except ImportError:
        pass
    lib = None
    for cand in [ctypes.util.find_library("hdf5_serial"), ctypes.util.find_library("hdf5"),
                 "libhdf5_serial.so", "libhdf5.so"]:
        if cand:
            try:
                lib = ctypes.CDLL(cand)
                break
            except OSError:
                continue
    if lib is None:
        sys.exit("gate_diagnostics.py: neither h5py nor libhdf5 found to read " + path)
    lib.H5open()
    hid = ctypes.c_int64
    lib.H5Fopen.restype = hid
    lib.H5Dopen2.restype = hid
    lib.H5Dget_space.restype = hid
    lib.H5Lexists.restype = ctypes.c_int
    f = lib.H5Fopen(path.encode(), 0, hid(0))
    if f < 0:
        sys.exit(f"gate_diagnostics.py: cannot open {path}")
    out = {}
    types = {np.uint32: "H5T_NATIVE_UINT32_g", np.uint64: "H5T_NATIVE_UINT64_g", np.uint8: "H5T_NATIVE_UINT8_g"}
    want = {"tokens": np.uint32, "doc_offsets": np.uint64, "task_type": np.uint8, "answer_spans": np.uint64}
    for n in names:
        if lib.H5Lexists(hid(f), n.encode(), hid(0)) <= 0:
            out[n] = None
            continue
        d = lib.H5Dopen2(hid(f), n.encode(), hid(0))
        sp = lib.H5Dget_space(hid(d))
        dims = (ctypes.c_uint64 * 4)()
        nd = lib.H5Sget_simple_extent_dims(hid(sp), dims, None)
        shape = tuple(dims[i] for i in range(nd))
        dt = want[n]
        buf = np.empty(shape, dtype=dt)
        mem_type = hid.in_dll(lib, types[dt])
        if lib.H5Dread(hid(d), mem_type, hid(0), hid(0), hid(0), buf.ctypes.data_as(ctypes.c_void_p)) < 0:
            sys.exit(f"gate_diagnostics.py: cannot read {path}:/{n}")
        lib.H5Sclose(hid(sp))
        lib.H5Dclose(hid(d))
        out[n] = buf
    lib.H5Fclose(hid(f))
    return out


def load_docs(data_dir, lo, hi, max_docs):
    docs = []
    for path in sorted(glob.glob(os.path.join(data_dir, "*.h5"))):
        ds = read_datasets(path, ["tokens", "doc_offsets", "task_type", "answer_spans"])
        if ds["task_type"] is None:
            continue
        off = ds["doc_offsets"].astype(np.int64)
        for i in range(len(off) - 1):
            L = int(off[i + 1] - off[i])
            t = int(ds["task_type"][i])
            if t == 0 or not (lo <= L <= hi):
                continue
            toks = ds["tokens"][off[i]:off[i + 1]].astype(np.int64)
            b, e = (int(x) for x in ds["answer_spans"][i])
            ans = toks[b:e]
            # the needle: the earliest occurrence of the answer's tokens before the answer
            needle = -1
            for p in range(0, b - len(ans)):
                if toks[p] == ans[0] and np.array_equal(toks[p:p + len(ans)], ans):
                    needle = p
                    break
            docs.append(dict(tokens=toks, task=t, ans=(b, e), needle=(needle, needle + len(ans)) if needle >= 0 else None))
            if len(docs) >= max_docs:
                return docs
    return docs


def _plain_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """torch < 2.0 (Debian 12's python3-torch) has no scaled_dot_product_attention."""
    L = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        attn_mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(s.masked_fill(~attn_mask, float("-inf")), -1) @ v


SDPA = getattr(F, "scaled_dot_product_attention", None) or _plain_sdpa


# ---- the gate ----
class Gate:
    """One forward's gating choice, read by the attention function (set per document and mode)."""
    def __init__(self):
        self.mode = "dense"         # dense | sparse
        self.qside = "mean"         # mean | max
        self.kside = "mean"         # mean | bounds | sub4
        self.k = 16
        self.block = 64
        self.local = 1
        self.theta = 8.0
        self.dense_layers = set()   # layers forced dense when mode is sparse
        self.sparse_layers = None   # if a set: only these layers sparse
        self.force = None           # (first, last) needle key blocks to force in (oracle)
        self.rows = None            # answer-row positions (tensor) to record at
        self.needle_blocks = []
        self.record = None          # list: per layer dicts


GATE = Gate()


def block_scores(q, k, g):
    """s (Hkv, nb, nb) block scores of query block i for key block j; q (H, L, D), k (Hkv, L, D)."""
    H, L, D = q.shape
    Hkv = k.shape[0]
    G = H // Hkv
    Bs = g.block
    nb = (L + Bs - 1) // Bs
    pad = nb * Bs - L
    scale = 1.0 / math.sqrt(D)
    kq = F.pad(k, (0, 0, 0, pad))                       # (Hkv, nb*Bs, D)
    kb = kq.view(Hkv, nb, Bs, D)
    cnt = torch.full((nb,), float(Bs), device=q.device)
    cnt[-1] = Bs - pad
    valid = (torch.arange(nb * Bs, device=q.device) < L).view(nb, Bs)
    qg = F.pad(q, (0, 0, 0, pad)).view(Hkv, G, nb, Bs, D)
    if g.kside == "mean":
        summ = [kb.sum(2) / cnt[None, :, None]]             # (Hkv, nb, D)
    elif g.kside == "sub4":
        S = 4
        sb = Bs // S
        v = valid.view(nb, S, sb)
        ks = kb.view(Hkv, nb, S, sb, D)
        c = v.sum(-1).clamp(min=1).float()               # (nb, S)
        means = ks.sum(3) / c[None, :, :, None]          # (Hkv, nb, S, D)
        summ = [means[:, :, s] for s in range(S)]
        # an empty sub-block (the last block's padding) must not win: mask its scores below
        empty = v.sum(-1) == 0                           # (nb, S)
    elif g.kside == "bounds":
        big = torch.finfo(k.dtype).max
        vm = valid[None, :, :, None]
        kmax = torch.where(vm, kb, torch.tensor(-big, device=q.device, dtype=k.dtype)).amax(2)
        kmin = torch.where(vm, kb, torch.tensor(big, device=q.device, dtype=k.dtype)).amin(2)
    else:
        raise ValueError(g.kside)

    def score_vec(qv):  # qv (Hkv, X, D) -> (Hkv, X, nb)
        if g.kside == "bounds":
            out = torch.zeros(qv.shape[0], qv.shape[1], nb, device=q.device, dtype=torch.float32)
            for j0 in range(0, nb, 32):
                j1 = min(nb, j0 + 32)
                a = qv[:, :, None, :] * kmax[:, None, j0:j1, :]
                b = qv[:, :, None, :] * kmin[:, None, j0:j1, :]
                out[:, :, j0:j1] = torch.maximum(a, b).float().sum(-1)
            return out * scale
        best = None
        for si, s in enumerate(summ):
            sc = torch.einsum("gxd,gjd->gxj", qv.float(), s.float()) * scale
            if g.kside == "sub4":
                sc = sc.masked_fill(empty[:, si][None, None, :], float("-inf"))
            best = sc if best is None else torch.maximum(best, sc)
        return best

    if g.qside == "mean":
        qbar = qg.sum((1, 3)) / (cnt[None, :, None] * G)    # (Hkv, nb, D)
        return score_vec(qbar)                           # (Hkv, nb, nb)
    # max over the query block's tokens (and the group's heads)
    out = torch.full((Hkv, nb, nb), float("-inf"), device=q.device)
    qt = qg.permute(0, 2, 3, 1, 4).reshape(Hkv, nb * Bs * G, D)   # (Hkv, tokens*G, D)
    step = 32 * Bs * G
    for x0 in range(0, qt.shape[1], step):
        sc = score_vec(qt[:, x0:x0 + step])              # (Hkv, X, nb)
        X = sc.shape[1]
        b0 = x0 // (Bs * G)
        sc = sc.view(Hkv, X // (Bs * G), Bs * G, nb)
        tv = valid[b0:b0 + X // (Bs * G)].repeat_interleave(G, dim=1) if G > 1 else valid[b0:b0 + X // (Bs * G)]
        sc = sc.masked_fill(~tv[None, :, :, None], float("-inf"))
        out[:, b0:b0 + X // (Bs * G)] = sc.amax(2)
    return out


def select(s, g, layer):
    """keep (Hkv, nb, nb) bool and the gate's softmax p; s (Hkv, nb, nb) scores."""
    Hkv, nb, _ = s.shape
    dev = s.device
    i = torch.arange(nb, device=dev)[:, None]
    j = torch.arange(nb, device=dev)[None, :]
    causal = j <= i
    anchor = (j == 0) | (j == i) | ((j >= i - g.local) & (j < i))
    anchor = anchor & causal
    sm = s.masked_fill(~causal[None], float("-inf"))
    p = torch.softmax(sm, -1)
    a = s.masked_fill(~anchor[None], float("-inf")).amax(-1, keepdim=True)
    cand = causal & ~anchor
    elig = cand[None] & (s >= a - g.theta)
    k = g.k
    keep = anchor[None].expand(Hkv, nb, nb).clone()
    sc = s.masked_fill(~elig, float("-inf"))
    force = None
    if g.force is not None:
        f0, f1 = g.force
        force = cand[None] & (j >= f0) & (j <= f1)   # the needle blocks, where they are candidates
        force = force.expand(Hkv, nb, nb)
        sc = sc.masked_fill(force, float("inf"))     # ranked first: forced in, within the same k
    if k > 0 and nb > 1:
        kk = min(k, nb)
        top = sc.topk(kk, dim=-1)
        ok = top.values > float("-inf")  # eligible (or forced) candidates only
        keep.scatter_(-1, top.indices, ok | keep.gather(-1, top.indices))
    return keep & causal[None], p, cand, sm


def sb_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The transformers attention interface: query (B, H, L, D), key/value (B, Hkv, L, D) after RoPE."""
    g = GATE
    layer = module.layer_idx
    B, H, L, D = query.shape
    Hkv = key.shape[1]
    G = H // Hkv
    scaling = scaling if scaling is not None else 1.0 / math.sqrt(D)
    kx = key.repeat_interleave(G, dim=1) if G > 1 else key
    vx = value.repeat_interleave(G, dim=1) if G > 1 else value
    sparse_here = g.mode == "sparse" and layer not in g.dense_layers and (g.sparse_layers is None or layer in g.sparse_layers)
    rec = g.record is not None and g.rows is not None
    if not sparse_here and not rec:
        out = SDPA(query, kx, vx, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    q0, k0 = query[0], key[0]
    s = block_scores(q0, k0, g)
    keep, p, cand, sm = select(s, g, layer)
    Bs = g.block
    nb = s.shape[1]
    if rec:
        rows = g.rows                                            # answer-predicting positions
        rb = rows // Bs
        # true recall: the dense softmax mass on the kept blocks, at the answer rows
        qr = query[0][:, rows].float()                            # (H, R, D)
        att = torch.einsum("hrd,hld->hrl", qr, kx[0].float()) * scaling
        cols = torch.arange(L, device=query.device)
        att = att.masked_fill(cols[None, None, :] > rows[None, :, None], float("-inf"))
        pr = torch.softmax(att, -1)                               # (H, R, L)
        kr = keep.repeat_interleave(G, dim=0) if G > 1 else keep  # (H, nb, nb)
        kept_tok = kr[:, rb].repeat_interleave(Bs, dim=-1)[..., :L]  # (H, R, L)
        true_recall = (pr * kept_tok).sum(-1)                     # (H, R)
        gate_recall = (p * keep).sum(-1)[:, rb]                   # (Hkv, R)
        info = {"layer": layer, "sparse": bool(sparse_here),
                "true_recall": true_recall.mean(1).tolist(), "gate_recall": gate_recall.mean(1).tolist()}
        if g.needle_blocks:
            ranks, kept = [], []
            for hk in range(Hkv):
                rk, kp = [], []
                for i in sorted(set(rb.tolist())):
                    for j in g.needle_blocks:
                        if j > i:
                            continue
                        if not bool(cand[i, j]):
                            rk.append(0)    # an anchor: always kept
                            kp.append(True)
                            continue
                        row = sm[hk, i].masked_fill(~cand[i], float("-inf"))
                        rk.append(int((row > row[j]).sum().item()) + 1)
                        kp.append(bool(keep[hk, i, j]))
                ranks.append(rk)
                kept.append(kp)
            info["needle_rank"] = ranks
            info["needle_kept"] = kept
        g.record.append(info)
    if not sparse_here:
        out = SDPA(query, kx, vx, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    kr = keep.repeat_interleave(G, dim=0) if G > 1 else keep          # (H, nb, nb)
    mask = kr.repeat_interleave(Bs, dim=1).repeat_interleave(Bs, dim=2)[:, :L, :L]
    mask = mask & torch.ones(L, L, dtype=torch.bool, device=query.device).tril()
    out = SDPA(query, kx, vx, attn_mask=mask[None], scale=scaling)
    return out.transpose(1, 2).contiguous(), None


# ---- a plain Llama/Qwen2 forward, for machines without transformers (--engine builtin) ----
def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
        data = f.read()
    dt = {"F32": np.float32, "F16": np.float16, "BF16": None}
    out = {}
    for name, m in head.items():
        if name == "__metadata__":
            continue
        b, e = m["data_offsets"]
        raw = np.frombuffer(data[b:e], dtype=np.uint16 if m["dtype"] == "BF16" else dt[m["dtype"]])
        if m["dtype"] == "BF16":  # bf16 -> f32: the high half of the word
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = torch.from_numpy(raw.astype(np.float32).reshape(m["shape"]))
    return out


class BuiltinLlama(torch.nn.Module):
    """The Llama family's forward (RMSNorm, rotate-half RoPE, SwiGLU, optional q/k/v biases, tied or
    untied head), attention through sb_attention, as transformers computes it in float32."""
    class Layer:
        def __init__(self, i):
            self.layer_idx = i

    def __init__(self, model_dir):
        super().__init__()
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        self.cfg = cfg
        w = {}
        for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
            w.update(read_safetensors(f))
        self.w = w
        self.nl, self.H = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        self.Hkv = cfg.get("num_key_value_heads", self.H)
        self.D = cfg.get("head_dim") or cfg["hidden_size"] // self.H
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        rp = cfg.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.layers = [self.Layer(i) for i in range(self.nl)]

    def to(self, dev):
        self.w = {k: v.to(dev) for k, v in self.w.items()}
        return self

    def rms(self, x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * wt

    def forward(self, input_ids):
        w, D = self.w, self.D
        x = w["model.embed_tokens.weight"][input_ids[0]]                    # (L, C)
        L = x.shape[0]
        inv = 1.0 / (self.theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
        ang = torch.arange(L, device=x.device, dtype=torch.float32)[:, None] * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)   # (L, D)

        def rope(t):  # (Hx, L, D)
            h1, h2 = t[..., :D // 2], t[..., D // 2:]
            return t * cos + torch.cat([-h2, h1], -1) * sin
        for i in range(self.nl):
            p = f"model.layers.{i}."
            h = self.rms(x, w[p + "input_layernorm.weight"])
            def proj(n):
                y = h @ w[p + f"self_attn.{n}_proj.weight"].T
                b = w.get(p + f"self_attn.{n}_proj.bias")
                return y + b if b is not None else y
            q = proj("q").view(L, self.H, D).transpose(0, 1)
            k = proj("k").view(L, self.Hkv, D).transpose(0, 1)
            v = proj("v").view(L, self.Hkv, D).transpose(0, 1)
            o, _ = sb_attention(self.layers[i], rope(q)[None], rope(k)[None], v[None], None, scaling=1.0 / math.sqrt(D))
            x = x + o[0].reshape(L, self.H * D) @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (F.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        x = self.rms(x, w["model.norm.weight"])
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])

        class Out:
            pass
        out = Out()
        out.logits = (x @ head.T)[None]
        return out


def run_doc(model, d, dev, record=False):
    toks = torch.tensor(d["tokens"], device=dev)[None]
    b, e = d["ans"]
    GATE.rows = torch.arange(b - 1, e - 1, device=dev) if record else None
    GATE.record = [] if record else None
    if d["needle"] is not None:
        GATE.needle_blocks = sorted({d["needle"][0] // GATE.block, (d["needle"][1] - 1) // GATE.block})
    else:
        GATE.needle_blocks = []
    with torch.no_grad():
        logits = model(input_ids=toks).logits[0]
    pred = logits[b - 1:e - 1].argmax(-1)
    ok = bool((pred == toks[0, b:e]).all().item())
    return ok, GATE.record


def set_mode(name, a):
    g = GATE
    g.mode, g.qside, g.kside, g.k = "sparse", "mean", "mean", a.k
    g.dense_layers, g.sparse_layers, g.force = set(), None, None
    if name == "dense":
        g.mode = "dense"
    elif name == "sparse":
        pass
    elif name == "oracle":
        pass  # the forced blocks are set per document
    elif name.startswith("q="):
        qs, ks = name.split("|")
        g.qside, g.kside = qs[2:], ks[2:]
    elif name.startswith("k="):
        g.k = int(name[2:])
    elif name.startswith("dense@"):
        g.dense_layers = {int(name[6:])}
    elif name.startswith("sparse@"):
        g.sparse_layers = {int(name[7:])}
    else:
        raise SystemExit(f"gate_diagnostics.py: unknown mode {name}")


def selftest(fixtures):
    """The builtin forward against transformers' logits in tests/convert/fixtures/*/golden.json."""
    GATE.mode, GATE.record = "dense", None
    worst = 0.0
    for d in sorted(glob.glob(os.path.join(fixtures, "*", "golden.json"))):
        m = BuiltinLlama(os.path.dirname(d))
        gold = json.load(open(d))
        err = max(float((m(torch.tensor([ids])).logits[0] - torch.tensor(lg)).abs().max())
                  for ids, lg in zip(gold["ids"], gold["logits"]))
        print(f"selftest {os.path.basename(os.path.dirname(d))}: max |logit - transformers| = {err:.2e}")
        worst = max(worst, err)
    if worst > 1e-4:
        sys.exit("selftest: FAILED")
    print("selftest: ok")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--selftest":
        return selftest(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--min-len", type=int, default=8193)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--docs", type=int, default=96)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--local", type=int, default=1)
    ap.add_argument("--theta", type=float, default=8.0)
    ap.add_argument("--modes", default="all")
    ap.add_argument("--out", default=".")
    ap.add_argument("--engine", choices=["transformers", "builtin"], default="transformers",
                    help="the model's forward: transformers' (GPU machine), or this file's plain Llama forward")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new modes after this many seconds")
    a = ap.parse_args()
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.engine == "transformers":
        import transformers
        from transformers import AutoModelForCausalLM, AttentionInterface
        AttentionInterface.register("sb_gate", sb_attention)
        f32 = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
        model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="sb_gate", **f32).to(dev).eval()
    else:
        model = BuiltinLlama(a.model).to(dev)
    n_layers = json.load(open(os.path.join(a.model, "config.json")))["num_hidden_layers"]
    GATE.block, GATE.local, GATE.theta = a.block, a.local, a.theta
    docs = load_docs(a.data, a.min_len, a.max_len, a.docs)
    print(f"{len(docs)} task documents of {a.min_len}-{a.max_len} tokens; {sum(d['needle'] is not None for d in docs)} with a needle found; "
          f"model {a.model} ({n_layers} layers) on {dev}", flush=True)
    if a.modes == "all":
        modes = (["dense", "sparse", "oracle", "q=max|k=mean", "q=mean|k=bounds", "q=max|k=bounds", "q=mean|k=sub4",
                  "q=max|k=sub4", f"k={2 * a.k}"] + [f"dense@{l}" for l in range(n_layers)] +
                 [f"sparse@{l}" for l in range(n_layers)])
    else:
        modes = a.modes.split(",")
    task_names = {1: "passkey", 2: "multikey", 3: "kv"}
    res = {"args": vars(a), "docs": len(docs), "modes": {}}
    for m in modes:
        if time.time() - t0 > a.budget_s:
            print(f"budget: stopped before {m}", flush=True)
            break
        set_mode(m, a)
        right = {1: 0, 2: 0, 3: 0}
        count = {1: 0, 2: 0, 3: 0}
        recs = []
        for d in docs:
            if m == "oracle":  # the needle's key blocks forced into every later row
                GATE.force = None if d["needle"] is None else (d["needle"][0] // a.block, (d["needle"][1] - 1) // a.block)
            ok, rec = run_doc(model, d, dev, record=(m in ("sparse", "oracle") or m.startswith("q=")))
            right[d["task"]] += ok
            count[d["task"]] += 1
            if rec:
                recs.append({"task": d["task"], "ok": ok, "layers": rec})
        acc = {task_names[t]: (right[t] / count[t] if count[t] else None) for t in right}
        acc["overall"] = sum(right.values()) / max(1, sum(count.values()))
        res["modes"][m] = {"accuracy": acc, "right": sum(right.values()), "n": sum(count.values()), "records": recs}
        print(f"{m:18s} overall {acc['overall']:.3f}  " + "  ".join(f"{t} {acc[t]:.3f}" for t in ("passkey", "multikey", "kv") if acc[t] is not None) +
              f"   ({time.time() - t0:.0f} s)", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "diagnostics.json"), "w") as f:
        json.dump(res, f)
    report(res, n_layers)


def report(res, n_layers):
    print("\n| mode | passkey | multikey | kv | overall |\n|---|---:|---:|---:|---:|")
    for m, r in res["modes"].items():
        a = r["accuracy"]
        cell = lambda x: "-" if x is None else f"{x:.3f}"
        print(f"| {m} | {cell(a['passkey'])} | {cell(a['multikey'])} | {cell(a['kv'])} | {cell(a['overall'])} ({r['right']}/{r['n']}) |")
    for m in [x for x in res["modes"] if res["modes"][x]["records"]]:
        recs = res["modes"][m]["records"]
        print(f"\n{m}: per layer, over answer rows and KV heads: needle rank among candidates (median, share ranked <= k "
              f"is not shown: kept share), needle kept, true recall, gate recall\n"
              "| layer | needle rank median | needle kept | true recall | gate recall |\n|---:|---:|---:|---:|---:|")
        for l in range(n_layers):
            rk, kp, tr, gr = [], [], [], []
            for r in recs:
                info = r["layers"][l]
                tr += info["true_recall"]
                gr += info["gate_recall"]
                for x in info.get("needle_rank", []):
                    rk += x
                for x in info.get("needle_kept", []):
                    kp += x
            med = float(np.median(rk)) if rk else float("nan")
            print(f"| {l} | {med:.0f} | {np.mean(kp) if kp else float('nan'):.3f} | {np.mean(tr):.3f} | {np.mean(gr):.3f} |")


if __name__ == "__main__":
    main()
