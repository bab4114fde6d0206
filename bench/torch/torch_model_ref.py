#!/usr/bin/env python3
"""PyTorch reference for the end-to-end training-throughput benchmark: the model of src/model/
(Llama-style decoder, Hugging Face Llama conventions) trained one step at a time on one GPU, to
compare with the C++/CUDA trainer. Plain PyTorch (>= 2.5; written for 2.11), no transformers.

Model (as src/model/model.cpp): embed -> L x [RMSNorm -> q/k/v projections (no bias) -> with
--qk-norm, RMSNorm over each head's q and k (Qwen3) -> RoPE (rotate-half, Hugging Face Llama;
positions restart at 0 in every document; plain: llama3/yarn scaling changes no cost) -> GQA
attention, causal within each packed document -> o_proj -> residual -> RMSNorm -> SwiGLU MLP
(gate/up/down) -> residual] -> RMSNorm -> LM head (tied to the embedding unless --untied) ->
cross-entropy, mean over targeted tokens (a token's target is the next token of the same document;
the last token of every document has none). rope_theta 1e4, norm eps 1e-5, init normal(0, 0.02) with
o_proj/down_proj scaled by 1/sqrt(2L), norms at 1 (the C++ defaults).

Training step (timed as a whole): forward + backward + clip_grad_norm_(1.0) + AdamW step + zero_grad.
fp32 master weights, bf16 autocast (torch.autocast("cuda", dtype=torch.bfloat16)), the residual
stream in fp32; torch.optim.AdamW(fused=True), lr 3e-3, betas (0.9, 0.95), eps 1e-8, weight decay
0.1 on matrices only (the C++ train.* defaults). Data: random token ids (seeded), the same batch
every step. --seq tokens per step = --docs equal-length documents of seq/docs tokens, laid out as a
batch of --docs rows (for equal-length documents this is exactly the packed sequence with attention
and RoPE restarted per document).

Attention:
  dense   F.scaled_dot_product_attention(is_causal=True) under
          sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION], set_priority=True); cuDNN is probed at
          start-up on the real shape and the backend that will run is printed. GQA: --gqa auto
          (dense: enable_gqa=True if cuDNN takes it, else repeat_interleave of k/v if cuDNN takes
          that, else enable_gqa=True on flash), native (enable_gqa=True) or repeat.
  sparse  FlexAttention (compiled) on a BlockMask from BlockMask.from_kv_blocks: per document and
          query block i keep block 0, block i and round(density*(i+1))-2 further blocks drawn
          uniformly from 1..i-1 (the splitmix64 draws of bench/cpp/bench_attention_cuda.cu and
          bench/torch/flex_attention_ref.py, so the masks are the same as there), same for all heads;
          off-diagonal kept blocks are "full" blocks, the diagonal block is causal (mask_mod q >= k).
          --density 1 is exactly causal attention. Needs (seq/docs) % block == 0.

Default shape (0.467B parameters, tied): --layers 24 --d-model 1280 --heads 10 --kv-heads 2
(head_dim D = 128; --head-dim sets it apart from C/H, as Qwen3's) --ffn 3584 --vocab 32768. Parameters
(as ModelDims::num_params): per_layer = 2*C + C*H*D + 2*C*Hkv*D + H*D*C + 3*C*F (+ 2*D with --qk-norm);
total = V*C + L*per_layer + C + (0 if tied else V*C).

FLOPs per token (model FLOPs, no recomputation counted; the same formula is printed at run time):
    N_lin    = L*per_layer + C + V*C   non-embedding parameters + LM head (V*C once, tied or not)
    F_dense  = 6 * N_lin                (forward 2 + backward 4 per parameter per token)
    pairs    = query-key pairs attended per document: dense S_d*(S_d+1)/2 (S_d = seq/docs, causal);
               sparse Bs^2 * sum_i (kept_i - 1/2) (kept blocks of row i, the diagonal one as half)
    F_attn   = 3 * L * 4*H*D * docs*pairs / seq   (forward: QK^T and PV, 2*H*D FLOPs each per pair)
    FLOPs/token = F_dense + F_attn;  MFU = FLOPs/token * tokens/s / 989e12
    (989e12 = H200 (= H100 SXM) dense BF16 tensor-core peak, no sparsity.) Note: the attention
    kernel benchmark (bench_attention_cuda, flex_attention_ref.py) counts 3.5 x forward for the
    attention's forward+backward (the backward recomputes QK^T); MFU here uses 3 x, as usual.

Usage (one H200):
  python3 bench/torch/torch_model_ref.py --check                      # tiny config, 2 steps, prints losses
  python3 bench/torch/torch_model_ref.py --seq 16384 --attention dense --csv bench/out/torch_ref.csv
  python3 bench/torch/torch_model_ref.py --seq 32768 --attention sparse --density 0.25 --csv ...
  options: --layers --d-model --heads --kv-heads --head-dim --qk-norm --ffn --vocab --untied --seq --docs
           --attention dense|sparse --block 128 --density 0.25 --steps 10 --warmup 3
           --compile [layers|model|off] (default layers: each decoder layer and the norm/head/loss
           compiled separately, as torchtitan does; model = the whole model in one graph) or
           --no-compile (FlexAttention alone is still compiled) --checkpoint-layers (activation
           checkpointing per layer) --gqa auto|native|repeat --grad-clip 1.0 --seed 1234
           --profile (print the top CUDA kernels of one extra step) --csv PATH (append one row)
Timing: CUDA events around each of --steps steps after --warmup steps (the first one compiles);
median (and mean) step ms; tokens/s = seq / median step time. An out-of-memory error prints OOM and
writes a row with status OOM instead of crashing (exit status 0).
"""
import argparse
import datetime
import math
import os
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.utils.checkpoint import checkpoint

PEAK_FLOPS = 989e12  # H200 dense BF16 tensor-core peak (same as H100 SXM), FLOP/s

FLOPS_FORMULA = (
    "FLOPs/token = 6*N_lin + 3*L*4*H*D*docs*pairs/seq  (training = 3 x forward; forward attention = 2 matmuls "
    "x 2*H*D FLOPs per query-key pair);  N_lin = L*(2C + 2*C*H*D + 2*C*Hkv*D + 3*C*F) + C + V*C;  "
    "pairs per document (S_d = seq/docs): dense S_d*(S_d+1)/2, sparse Bs^2*sum_i(kept_i - 1/2) (diagonal block = half);  "
    "MFU = FLOPs/token * tokens/s / 989e12 (H200 dense BF16 peak)")

# ---------------------------------------------------------------------------------------------
# Sparse block mask: row_blocks(i, density, seed) of flex_attention_ref.py (the splitmix64 draws of
# bench/cpp/bench_attention_cuda.cu), so all three programs run the identical mask.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flex_attention_ref import row_blocks  # noqa: E402


def causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sparse_block_mask(seq_doc, docs, density, seed, bs, device):
    """BlockMask of shape (docs, 1, nb, nb) (same rows for every document and head).
    Returns (mask, pairs per document, kept fraction of the causal blocks)."""
    nb = seq_doc // bs
    full_num = [0] * nb
    full_idx = [[0] * nb for _ in range(nb)]
    part_idx = [[0] * nb for _ in range(nb)]
    kept = 0
    blocks = 0.0  # kept blocks, diagonal as half
    for i in range(nb):
        js = row_blocks(i, density, seed)
        off = [j for j in js if j != i]
        full_num[i] = len(off)
        full_idx[i][: len(off)] = off
        part_idx[i][0] = i
        kept += len(js)
        blocks += len(off) + 0.5
    i32 = torch.int32

    def dev(t):  # (1, 1, ...) -> (docs, 1, ...), materialized (no batch broadcasting in the mask)
        return t.expand(docs, *t.shape[1:]).contiguous().to(device)

    part_num_t = dev(torch.ones(1, 1, nb, dtype=i32))
    part_idx_t = dev(torch.tensor(part_idx, dtype=i32).view(1, 1, nb, nb))
    full_num_t = dev(torch.tensor(full_num, dtype=i32).view(1, 1, nb))
    full_idx_t = dev(torch.tensor(full_idx, dtype=i32).view(1, 1, nb, nb))
    bm = BlockMask.from_kv_blocks(part_num_t, part_idx_t, full_num_t, full_idx_t, BLOCK_SIZE=bs,
                                  mask_mod=causal_mask_mod, seq_lengths=(seq_doc, seq_doc))
    return bm, blocks * bs * bs, kept / (nb * (nb + 1) / 2)


# ---------------------------------------------------------------------------------------------
# Model

# The block mask, read by the attention modules from this holder rather than passed as a forward
# argument, so activation checkpointing and the compiled regions take only tensors.
_FLEX = {"mask": None, "opts": None}


def flex_kernel_options(bs):
    """FlexAttention's Triton tiles must divide the mask's blocks; its default tiles are 128, so a
    block of 64 (configs/qwen2.5-0.5b.toml) needs 64-wide tiles forward and backward, or the compile
    fails ("Q and KV block size must be divisible by BLOCK_M and BLOCK_N")."""
    if bs >= 128:
        return None
    return {k: bs for k in ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")}


class Cfg:
    def __init__(self, a):
        self.L, self.C, self.H, self.Hkv, self.F, self.V = a.layers, a.d_model, a.heads, a.kv_heads, a.ffn, a.vocab
        self.D = a.head_dim or self.C // self.H
        self.qk_norm, self.tied = a.qk_norm, not a.untied
        self.rope_theta, self.eps, self.init_std = 10000.0, 1e-5, 0.02

    def per_layer(self):
        C, H, Hkv, D, F_ = self.C, self.H, self.Hkv, self.D, self.F
        return 2 * C + H * D * C + 2 * Hkv * D * C + C * H * D + 3 * F_ * C + (2 * D if self.qk_norm else 0)

    def num_params(self):  # as ModelDims::num_params
        return self.V * self.C + self.L * self.per_layer() + self.C + (0 if self.tied else self.V * self.C)

    def n_lin(self):  # non-embedding parameters + LM head
        return self.L * self.per_layer() + self.C + self.V * self.C


class RMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq_doc, D, theta, device):
    """cos, sin (seq_doc, 1, D) in bf16; angle pos * theta^(-2d/D), d < D/2, duplicated (rotate-half)."""
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64, device=device) / D))
    ang = torch.outer(torch.arange(seq_doc, dtype=torch.float64, device=device), inv)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(torch.bfloat16)[:, None, :], emb.sin().to(torch.bfloat16)[:, None, :]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):  # x (B, S, h, D) bf16
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, c, sparse, gqa_repeat, flex_fn):
        super().__init__()
        self.H, self.Hkv, self.D = c.H, c.Hkv, c.D
        self.q_proj = nn.Linear(c.C, c.H * c.D, bias=False)
        self.k_proj = nn.Linear(c.C, c.Hkv * c.D, bias=False)
        self.v_proj = nn.Linear(c.C, c.Hkv * c.D, bias=False)
        self.o_proj = nn.Linear(c.H * c.D, c.C, bias=False)
        self.sparse = sparse
        self.repeat = gqa_repeat and c.H != c.Hkv
        self.gqa = (not gqa_repeat) and c.H != c.Hkv
        self.flex_fn = flex_fn
        self.q_norm = RMSNorm(c.D, c.eps) if c.qk_norm else None  # Qwen3: over each head's D
        self.k_norm = RMSNorm(c.D, c.eps) if c.qk_norm else None

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        q, k = self.q_proj(x).view(B, S, self.H, self.D), self.k_proj(x).view(B, S, self.Hkv, self.D)
        if self.q_norm is not None:  # back to the projection's dtype (bf16 under autocast), as HF's Qwen3
            q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
        q = apply_rope(q, cos, sin).transpose(1, 2)
        k = apply_rope(k, cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.Hkv, self.D).transpose(1, 2)
        if self.repeat:  # kv head of query head h = h // (H/Hkv), as repeat_kv in HF and the C++ kernels
            k = k.repeat_interleave(self.H // self.Hkv, dim=1)
            v = v.repeat_interleave(self.H // self.Hkv, dim=1)
        if self.sparse:
            o = self.flex_fn(q, k, v, block_mask=_FLEX["mask"], enable_gqa=self.gqa,
                             kernel_options=_FLEX["opts"])
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)
        return self.o_proj(o.transpose(1, 2).reshape(B, S, self.H * self.D))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.C, c.F, bias=False)
        self.up_proj = nn.Linear(c.C, c.F, bias=False)
        self.down_proj = nn.Linear(c.F, c.C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c, sparse, gqa_repeat, flex_fn, ckpt):
        super().__init__()
        self.input_layernorm = RMSNorm(c.C, c.eps)
        self.self_attn = Attention(c, sparse, gqa_repeat, flex_fn)
        self.post_attention_layernorm = RMSNorm(c.C, c.eps)
        self.mlp = MLP(c)
        self.ckpt = ckpt

    def _forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)  # fp32 residual stream
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, x, cos, sin):
        if self.ckpt:
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)


class Head(nn.Module):
    """Final RMSNorm -> LM head -> cross-entropy (mean over targets != -100)."""

    def __init__(self, c, embed):
        super().__init__()
        self.norm = RMSNorm(c.C, c.eps)
        self.lm_head = nn.Linear(c.C, c.V, bias=False)
        if c.tied:
            self.lm_head.weight = embed.weight

    def forward(self, x, targets):
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)


class Llama(nn.Module):
    def __init__(self, c, sparse, gqa_repeat, flex_fn, ckpt):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.V, c.C)
        self.layers = nn.ModuleList([Block(c, sparse, gqa_repeat, flex_fn, ckpt) for _ in range(c.L)])
        self.head = Head(c, self.embed_tokens)

    def forward(self, tokens, targets, cos, sin):
        x = self.embed_tokens(tokens)  # fp32 (B, S, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(x, targets)


def init_weights(model, c, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out_scale = 1.0 / math.sqrt(2.0 * c.L)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            std = c.init_std * (out_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
            p.copy_(torch.randn(p.shape, generator=g, device=p.device) * std)


# ---------------------------------------------------------------------------------------------
# Set-up helpers

def is_oom(e):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def cudnn_sdpa_ok(B, H, Hkv, S, D, gqa_native):
    """Whether cuDNN SDPA (alone) runs forward+backward on this shape; (ok, message)."""
    hk = Hkv if gqa_native else H
    try:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, hk, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, hk, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa_native and H != Hkv)
            o.float().sum().backward()
        torch.cuda.synchronize()
        return True, "ok"
    except Exception as e:  # noqa: BLE001
        return False, str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__


def choose_dense_path(a, c, seq_doc):
    """Returns (gqa_repeat, backend name) for dense attention, after probing cuDNN on the real shape."""
    B = a.docs
    if c.H == c.Hkv:
        ok, msg = cudnn_sdpa_ok(B, c.H, c.Hkv, seq_doc, c.D, False)
        return False, "cudnn" if ok else f"flash (cuDNN refused: {msg})"
    if a.gqa in ("auto", "native"):
        ok, msg = cudnn_sdpa_ok(B, c.H, c.Hkv, seq_doc, c.D, True)
        if ok:
            return False, "cudnn, enable_gqa"
        if a.gqa == "native":
            return False, f"flash, enable_gqa (cuDNN refused enable_gqa: {msg})"
    ok2, msg2 = cudnn_sdpa_ok(B, c.H, c.Hkv, seq_doc, c.D, False)
    if a.gqa == "repeat":
        return True, "cudnn, repeat_interleave" if ok2 else f"flash, repeat_interleave (cuDNN refused: {msg2})"
    if ok2:
        return True, "cudnn, repeat_interleave (cuDNN refused enable_gqa)"
    return False, f"flash, enable_gqa (cuDNN refused: {msg2})"


def build(a, c, sparse, gqa_repeat, compile_mode, seq_doc):
    dev = "cuda"
    if sparse and compile_mode == "off":
        flex_fn = torch.compile(flex_attention, dynamic=False)  # eager FlexAttention is unusable
    else:
        flex_fn = flex_attention  # traced inside the compiled layers/model
    torch.manual_seed(a.seed)
    with torch.device(dev):
        model = Llama(c, sparse, gqa_repeat, flex_fn, a.checkpoint_layers)
    init_weights(model, c, a.seed)
    if compile_mode == "layers":
        for layer in model.layers:
            layer.compile(dynamic=False)
        model.head.compile(dynamic=False)
    elif compile_mode == "model":
        model.compile(dynamic=False)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    g = torch.Generator(device=dev).manual_seed(a.seed + 1)
    tokens = torch.randint(0, c.V, (a.docs, seq_doc), device=dev, generator=g)
    targets = torch.full_like(tokens, -100)
    targets[:, :-1] = tokens[:, 1:]
    cos, sin = rope_tables(seq_doc, c.D, c.rope_theta, dev)
    return model, opt, tokens, targets, cos, sin


def make_step(model, opt, tokens, targets, cos, sin, clip):
    params = [p for p in model.parameters()]

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(tokens, targets, cos, sin)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def attn_pairs(a, seq_doc, sparse, density):
    """(pairs per document, kept fraction, block mask or None)."""
    if not sparse:
        return seq_doc * (seq_doc + 1) / 2, 1.0, None
    bm, pairs, kept = sparse_block_mask(seq_doc, a.docs, density, a.seed, a.block, "cuda")
    return pairs, kept, bm


def flops_per_token(c, a, pairs):
    f_lin = 6.0 * c.n_lin()
    f_attn = 3.0 * c.L * 4.0 * c.H * c.D * a.docs * pairs / a.seq
    return f_lin + f_attn, f_attn


# ---------------------------------------------------------------------------------------------
# Benchmark and check

CSV_COLS = ["time", "gpu", "torch", "layers", "d_model", "heads", "kv_heads", "head_dim", "qk_norm", "ffn", "vocab", "tied",
            "seq", "docs", "attention", "block", "density", "kept_frac", "compile", "checkpoint_layers",
            "attn_backend", "steps", "warmup", "params", "flops_per_token", "attn_flops_per_token",
            "step_ms_median", "step_ms_mean", "tokens_per_s", "model_tflops", "mfu", "peak_mem_gib",
            "loss_first", "loss_last", "status"]


def write_csv(path, row):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a") as f:
        if new:
            f.write(",".join(CSV_COLS) + "\n")
        f.write(",".join(str(row.get(k, "")).replace(",", ";") for k in CSV_COLS) + "\n")


def run_bench(a, c, compile_mode):
    sparse = a.attention == "sparse"
    seq_doc = a.seq // a.docs
    row = {"time": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "layers": c.L, "d_model": c.C, "heads": c.H, "kv_heads": c.Hkv,
           "head_dim": c.D, "qk_norm": int(c.qk_norm), "ffn": c.F, "vocab": c.V, "tied": int(c.tied), "seq": a.seq, "docs": a.docs,
           "attention": a.attention, "block": a.block if sparse else "", "density": a.density if sparse else 1.0,
           "compile": compile_mode, "checkpoint_layers": int(a.checkpoint_layers), "steps": a.steps,
           "warmup": a.warmup, "params": c.num_params(), "status": "ok"}
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"model: L={c.L} C={c.C} H={c.H} Hkv={c.Hkv} D={c.D} qk_norm={c.qk_norm} F={c.F} V={c.V} tied={c.tied}; "
          f"params {c.num_params():,} ({c.num_params() / 1e9:.3f}B; per layer {c.per_layer():,}; "
          f"non-embedding + LM head N_lin {c.n_lin():,})")
    print(f"batch: seq {a.seq} tokens = {a.docs} doc(s) x {seq_doc}; attention {a.attention}"
          + (f" (block {a.block}, density {a.density})" if sparse else "")
          + f"; compile {compile_mode}; checkpoint_layers {a.checkpoint_layers}; steps {a.steps} after {a.warmup} warm-up")
    try:
        if sparse:
            gqa_repeat = a.gqa == "repeat"
            backend = "flex, " + ("repeat_interleave" if gqa_repeat else "enable_gqa") if c.H != c.Hkv else "flex"
        else:
            gqa_repeat, backend = choose_dense_path(a, c, seq_doc)
        row["attn_backend"] = backend
        print(f"attention backend: {backend}")
        pairs, kept, bm = attn_pairs(a, seq_doc, sparse, a.density)
        _FLEX["mask"], _FLEX["opts"] = bm, flex_kernel_options(a.block)
        row["kept_frac"] = f"{kept:.4f}"
        fpt, fattn = flops_per_token(c, a, pairs)
        row["flops_per_token"] = f"{fpt:.6e}"
        row["attn_flops_per_token"] = f"{fattn:.6e}"
        print(f"FLOPs: {FLOPS_FORMULA}")
        print(f"       pairs/doc {pairs:.6e} (kept fraction of causal blocks {kept:.4f}); 6*N_lin {6.0 * c.n_lin():.4e}"
              f" + attention {fattn:.4e} = {fpt:.4e} FLOPs/token ({100 * fattn / fpt:.1f}% attention)")

        model, opt, tokens, targets, cos, sin = build(a, c, sparse, gqa_repeat, compile_mode, seq_doc)
        n_actual = sum(p.numel() for p in model.parameters())
        if n_actual != c.num_params():
            print(f"WARNING: model has {n_actual:,} parameters, formula says {c.num_params():,}", file=sys.stderr)
        step = make_step(model, opt, tokens, targets, cos, sin, a.grad_clip)
        torch.cuda.reset_peak_memory_stats()
        t0 = datetime.datetime.now()
        losses = []
        for _ in range(a.warmup):
            losses.append(step())
        torch.cuda.synchronize()
        if a.warmup:
            print(f"warm-up ({a.warmup} steps, includes compilation): "
                  f"{(datetime.datetime.now() - t0).total_seconds():.1f} s", flush=True)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.steps)]
        for s, e in ev:
            s.record()
            losses.append(step())
            e.record()
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) for s, e in ev]
        med, mean = statistics.median(ts), statistics.fmean(ts)
        tps = a.seq / (med * 1e-3)
        mfu = fpt * tps / PEAK_FLOPS
        peak = torch.cuda.max_memory_allocated() / 2**30
        lv = [float(x) for x in losses]
        row.update(step_ms_median=f"{med:.3f}", step_ms_mean=f"{mean:.3f}", tokens_per_s=f"{tps:.1f}",
                   model_tflops=f"{fpt * tps / 1e12:.2f}", mfu=f"{mfu:.4f}", peak_mem_gib=f"{peak:.2f}",
                   loss_first=f"{lv[0]:.4f}", loss_last=f"{lv[-1]:.4f}")
        print(f"step ms: median {med:.2f}, mean {mean:.2f}, min {min(ts):.2f}, max {max(ts):.2f}")
        print(f"tokens/s {tps:,.0f}; model TFLOP/s {fpt * tps / 1e12:.1f}; "
              f"MFU {100 * mfu:.1f}% (of {PEAK_FLOPS / 1e12:.0f} TFLOP/s, H200 dense BF16)")
        print(f"peak memory {peak:.1f} GiB; loss first {lv[0]:.4f}, last {lv[-1]:.4f} (ln V = {math.log(c.V):.4f})")
        if a.profile:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            try:
                print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=20))
            except Exception:  # noqa: BLE001  (older names)
                print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20))
    except Exception as e:  # noqa: BLE001
        if not is_oom(e):
            raise
        print("OOM:", str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__)
        row["status"] = "OOM"
    if a.csv:
        write_csv(a.csv, row)
    return row


def run_check(a, compile_mode):
    """Tiny config, 2 steps each with dense, sparse density 1 (= causal) and sparse --density (or 0.5):
    the first losses of dense and sparse density 1 are the same model on the same data."""
    a.layers, a.d_model, a.heads, a.kv_heads, a.ffn, a.vocab = 2, 256, 4, 2, 512, 1024
    a.seq, a.docs, a.block, a.steps, a.warmup = 2048, 2, 128, 2, 0
    c = Cfg(a)
    seq_doc = a.seq // a.docs
    print(f"check: L={c.L} C={c.C} H={c.H} Hkv={c.Hkv} D={c.D} qk_norm={c.qk_norm} F={c.F} V={c.V}, seq {a.seq} = {a.docs} x {seq_doc},"
          f" compile {compile_mode}, checkpoint_layers {a.checkpoint_layers}; ln V = {math.log(c.V):.4f}")
    first = {}
    for name, sparse, dens in [("dense", False, 1.0), ("sparse d=1", True, 1.0),
                               (f"sparse d={a.density if a.density < 1 else 0.5}", True,
                                a.density if a.density < 1 else 0.5)]:
        if sparse:
            gqa_repeat, backend = a.gqa == "repeat", "flex"
        else:
            gqa_repeat, backend = choose_dense_path(a, c, seq_doc)
        pairs, kept, bm = attn_pairs(a, seq_doc, sparse, dens)
        _FLEX["mask"], _FLEX["opts"] = bm, flex_kernel_options(a.block)
        model, opt, tokens, targets, cos, sin = build(a, c, sparse, gqa_repeat, compile_mode, seq_doc)
        n_actual = sum(p.numel() for p in model.parameters())
        step = make_step(model, opt, tokens, targets, cos, sin, a.grad_clip)
        losses = [float(step()) for _ in range(a.steps)]
        first[name] = losses[0]
        print(f"  {name:>14} [{backend}]: params {n_actual:,} (formula {c.num_params():,}), kept {kept:.3f}, "
              f"FLOPs/token {flops_per_token(c, a, pairs)[0]:.4e}; losses " + " ".join(f"{x:.5f}" for x in losses),
              flush=True)
        del model, opt, step
        torch.cuda.empty_cache()
    d = abs(first["dense"] - first["sparse d=1"])
    ok = d < 2e-2 and abs(first["dense"] - math.log(c.V)) < 0.5
    print(f"check {'OK' if ok else 'FAILED'}: |dense - sparse d=1| first loss = {d:.2e}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=1280)
    ap.add_argument("--heads", type=int, default=10)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=0, help="per-head size D (0 = d_model / heads; Qwen3-0.6B: 128)")
    ap.add_argument("--qk-norm", action="store_true", help="RMSNorm over each head's q and k before RoPE (Qwen3)")
    ap.add_argument("--ffn", type=int, default=3584)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--untied", action="store_true", help="separate LM head (default: tied to the embedding)")
    ap.add_argument("--seq", type=int, default=16384, help="tokens per step (context length)")
    ap.add_argument("--docs", type=int, default=1, help="equal-length documents packed into --seq")
    ap.add_argument("--attention", choices=["dense", "sparse"], default="dense")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", nargs="?", const="layers", default="layers", choices=["layers", "model", "off"])
    ap.add_argument("--no-compile", action="store_true", help="= --compile off (FlexAttention itself stays compiled)")
    ap.add_argument("--checkpoint-layers", action="store_true", help="activation checkpointing per decoder layer")
    ap.add_argument("--gqa", choices=["auto", "native", "repeat"], default="auto")
    ap.add_argument("--grad-clip", type=float, default=1.0, help="0 = off")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--csv", default=None, help="append one row to this CSV")
    ap.add_argument("--check", action="store_true", help="tiny config, 2 steps, print losses")
    a = ap.parse_args()
    compile_mode = "off" if a.no_compile else a.compile
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    torch.set_float32_matmul_precision("high")
    # regional compilation: the layers share one compiled code; allow recompiles without falling back to eager
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
        torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 512)

    if (not a.head_dim and a.d_model % a.heads) or a.heads % a.kv_heads or (a.head_dim or a.d_model // a.heads) % 2:
        sys.exit("need d_model % heads == 0 (or --head-dim), heads % kv_heads == 0 and an even head_dim")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        if a.check:
            return run_check(a, compile_mode)
        if a.seq % a.docs:
            sys.exit(f"--seq {a.seq} is not a multiple of --docs {a.docs}")
        if a.attention == "sparse" and (a.seq // a.docs) % a.block:
            sys.exit(f"sparse attention needs seq/docs = {a.seq // a.docs} to be a multiple of --block {a.block}")
        if not 0 < a.density <= 1:
            sys.exit("--density must be in (0, 1]")
        if a.steps < 1 or a.warmup < 0 or a.docs < 1:
            sys.exit("need --steps >= 1, --warmup >= 0, --docs >= 1")
        run_bench(a, Cfg(a), compile_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
