#!/usr/bin/env python3
"""PyTorch + peft LoRA beside `sparsebalance train` with [lora] (bench/gpu/gpu_lora_7b.sh): the network of
torch_model_ref.py (imported: its Llama, FlexAttention mask and cuDNN probe), base in bf16 and frozen,
peft LoRA (r 16, alpha 32, all seven projections; peft keeps the adapters fp32), activation
checkpointing per decoder layer, a chunked LM head + cross-entropy (the tokens x vocab logits never
whole, as our model.lm_head_chunk), fused AdamW on the adapters. Dense: cuDNN SDPA; sparse:
FlexAttention at the kept fraction our gating reported (--density). torch_model_ref.py has no q/k/v
biases (frozen and tiny here).
  python3 bench/torch/torch_lora_ref.py --layers 28 --d-model 3584 --heads 28 --kv-heads 4 --ffn 18944 \
      --vocab 152064 --untied --seq 32768 --attention sparse --density 0.2 --steps 4 --warmup 2 --csv out.csv
Prints and appends to --csv: step time (median of the timed steps, CUDA events), tokens/s, peak memory
(torch.cuda.max_memory_allocated, weights included) and the losses. MFU: gpu_lora_7b.sh computes it for
both sides with one formula."""
import argparse, datetime, math, os, statistics, sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model_ref as T  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
COLS = ["time", "gpu", "torch", "peft", "seq", "attention", "density", "kept_frac", "attn_backend", "compile", "rank",
        "alpha", "trainable", "steps", "step_ms_median", "tokens_per_s", "peak_mem_gib", "loss_first", "loss_last",
        "status"]


class ChunkedHead(nn.Module):
    """Final RMSNorm -> LM head -> cross-entropy over `chunk` tokens at a time, each chunk recomputed in
    the backward: only one chunk's logits (chunk x V, fp32) live at once."""

    def __init__(self, head, chunk):
        super().__init__()
        self.norm, self.lm_head, self.chunk = head.norm, head.lm_head, chunk

    def _piece(self, x, t):
        logits = self.lm_head(self.norm(x)).float()
        return F.cross_entropy(logits, t, ignore_index=-100, reduction="sum")

    def forward(self, x, targets):  # x (B, S, C), targets (B, S)
        x, t = x.reshape(-1, x.shape[-1]), targets.reshape(-1)
        total = sum(checkpoint(self._piece, x[i:i + self.chunk], t[i:i + self.chunk], use_reentrant=False)
                    for i in range(0, x.shape[0], self.chunk))
        return total / (t != -100).sum()


def build(a, c, sparse, gqa_repeat):
    import peft
    flex_fn = torch.compile(T.flex_attention, dynamic=False) if sparse and a.compile == "off" else T.flex_attention
    torch.manual_seed(a.seed)
    with torch.device("cuda"):
        model = T.Llama(c, sparse, gqa_repeat, flex_fn, True)  # checkpointing per decoder layer
    T.init_weights(model, c, a.seed)
    model.head = ChunkedHead(model.head, a.lm_chunk)
    model.to(torch.bfloat16)  # the frozen base: 2 bytes a parameter
    cfg = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=TARGETS, bias="none")
    pm = peft.get_peft_model(model, cfg)  # freezes the rest; adapters fp32 (autocast_adapter_dtype)
    llama = pm.get_base_model()
    if a.compile == "layers":
        for layer in llama.layers:
            layer.compile(dynamic=False)
    params = [p for p in llama.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    g = torch.Generator(device="cuda").manual_seed(a.seed + 1)
    tokens = torch.randint(0, c.V, (1, a.seq), device="cuda", generator=g)
    targets = torch.full_like(tokens, -100)
    targets[:, :-1] = tokens[:, 1:]
    cos, sin = T.rope_tables(a.seq, c.D, c.rope_theta, "cuda")
    return llama, params, opt, tokens, targets, cos, sin, peft.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, d in [("layers", 28), ("d-model", 3584), ("heads", 28), ("kv-heads", 4), ("ffn", 18944), ("vocab", 152064),
                 ("seq", 32768), ("block", 128), ("steps", 4), ("warmup", 2), ("rank", 16), ("lm-chunk", 4096),
                 ("seed", 1234)]:
        ap.add_argument("--" + k, type=int, default=d)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--attention", choices=["dense", "sparse"], default="dense")
    ap.add_argument("--density", type=float, default=0.25, help="kept fraction of causal blocks (sparse)")
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--compile", choices=["layers", "off"], default="layers",
                    help="torch.compile each decoder layer (off: eager, FlexAttention alone compiled)")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    a.head_dim, a.qk_norm, a.docs, a.gqa = 0, False, 1, "auto"
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    if a.attention == "sparse" and a.seq % a.block:
        sys.exit(f"--seq {a.seq} must be a multiple of --block {a.block}")
    torch.set_float32_matmul_precision("high")
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    c = T.Cfg(a)
    c.rope_theta, c.eps = 1e6, 1e-6
    sparse = a.attention == "sparse"
    row = {"time": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "seq": a.seq, "attention": a.attention, "density": a.density if sparse else 1.0,
           "compile": a.compile, "rank": a.rank, "alpha": a.alpha, "steps": a.steps, "status": "ok"}
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
            if sparse:
                gqa_repeat, backend = False, "flex, enable_gqa"
            else:
                gqa_repeat, backend = T.choose_dense_path(a, c, a.seq)
            _, kept, bm = T.attn_pairs(a, a.seq, sparse, a.density)
            T._FLEX["mask"], T._FLEX["opts"] = bm, T.flex_kernel_options(a.block)
            row.update(attn_backend=backend, kept_frac=f"{kept:.4f}")
            llama, params, opt, tokens, targets, cos, sin, pv = build(a, c, sparse, gqa_repeat)
            n_train = sum(p.numel() for p in params)
            row.update(peft=pv, trainable=n_train)
            print(f"{row['gpu']}, torch {row['torch']}, peft {pv}; seq {a.seq}, {a.attention} ({backend}, kept {kept:.4f}); "
                  f"LoRA r {a.rank} alpha {a.alpha}: {n_train:,} trainable; compile {a.compile}", flush=True)

            def step():
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = llama(tokens, targets, cos, sin)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss.detach()

            torch.cuda.reset_peak_memory_stats()
            losses = [step() for _ in range(a.warmup)]
            torch.cuda.synchronize()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.steps)]
            for s, e in ev:
                s.record()
                losses.append(step())
                e.record()
            torch.cuda.synchronize()
            ms = statistics.median(s.elapsed_time(e) for s, e in ev)
            lv = [float(x) for x in losses]
            peak = torch.cuda.max_memory_allocated() / 2**30
            row.update(step_ms_median=f"{ms:.1f}", tokens_per_s=f"{a.seq / (ms / 1e3):.1f}", peak_mem_gib=f"{peak:.2f}",
                       loss_first=f"{lv[0]:.4f}", loss_last=f"{lv[-1]:.4f}")
            print(f"step {ms:.1f} ms (median of {a.steps}); tokens/s {a.seq / (ms / 1e3):,.0f}; peak {peak:.2f} GiB; "
                  f"loss {lv[0]:.4f} -> {lv[-1]:.4f} (ln V = {math.log(c.V):.4f})")
    except Exception as e:  # noqa: BLE001
        if not T.is_oom(e):
            raise
        print("OOM:", str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__)
        row["status"] = "OOM"
    if a.csv:
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a") as f:
            if new:
                f.write(",".join(COLS) + "\n")
            f.write(",".join(str(row.get(k, "")).replace(",", ";") for k in COLS) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
