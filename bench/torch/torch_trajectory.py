#!/usr/bin/env python3
"""A PyTorch reference trajectory for `sparsebalance train` (issue 19), on the GPU machine.

    python3 bench/torch/torch_trajectory.py --hf INIT_DIR --batches BATCHES.jsonl --metrics METRICS.h5 \
        --checkpoint CKPT.h5 [--steps N] [--json OUT.json]

INIT_DIR   the initial weights as an HF directory: `sparsebalance convert` of the checkpoint the run
           started from (f32, so both sides start from the same bits), loaded with transformers
           (AutoModelForCausalLM, sdpa attention).
BATCHES    the run's log.batches file: one JSON line per step with every segment's tokens and
           trained targets (-1 = none), exactly what our trainer packed (src/train/batch_log.hpp).
           Packed documents never see each other in our model (per-document causal masks), so
           each segment runs here as its own sequence: the same masks, no 4D mask needed.
METRICS    the run's log.path (HDF5 /steps: loss, grad_norm, lr per step), to compare with.
CKPT       any checkpoint of the run: its stored config gives the optimizer settings (train.lr,
           min_lr_ratio, warmup_steps, steps, weight_decay, beta1, beta2, adam_eps, grad_clip).

(a) The dense loss of step 1's documents at the initial weights, in float32 and in bf16 autocast,
    against our step-1 loss (our loss is computed before the step's update).
(b) --steps N (default 10): a plain PyTorch loop over the same batches with our optimizer exactly
    (src/engine/update.cpp): loss = sum of cross-entropies / the step's target count; gradient norm
    over all parameters (tied head counted once); clip by grad_clip / norm when above; linear warmup
    then cosine to lr * min_lr_ratio; AdamW with bias correction and decoupled decay lr * wd * p, no
    decay on norms and biases. fp32 master weights, bf16 autocast matmuls (as our CUDA engine).
    Prints our loss, grad norm and lr beside PyTorch's per step; --json writes them.
--adapter DIR (LoRA, issue 52): the base INIT_DIR with the PEFT adapter DIR on top
    (peft.PeftModel.from_pretrained, is_trainable): only the adapters and modules_to_save train,
    as in our LoRA run (which started --init-from DIR); decay on the adapters and an embedding/head,
    none on norms. --fp32: no autocast (our CPU engine computes in fp32).
Needs torch, transformers, h5py (the GPU machine has them); peft with --adapter.
"""
import argparse
import json
import math
import sys
import time
import tomllib

import h5py
import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForCausalLM


def read_steps(path):
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        s = f["steps"][()]
    return {int(r["step"]): {"loss": float(r["loss"]), "grad_norm": float(r["grad_norm"]), "lr": float(r["lr"]),
                             "skipped": int(r["skipped"])} for r in s}


def read_optim(path):
    with h5py.File(path, "r") as f:
        raw = f["config"][()]
    cfg = tomllib.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
    t = {"lr": 3e-3, "min_lr_ratio": 0.1, "warmup_steps": 4, "steps": 40, "weight_decay": 0.1, "beta1": 0.9,
         "beta2": 0.95, "adam_eps": 1e-8, "grad_clip": 1.0}  # the schema's defaults (src/config/KEYS.md)
    t.update({k: v for k, v in cfg.get("train", {}).items() if k in t})
    decay = cfg.get("train", {}).get("decay_steps", 0)
    t["decay_steps"] = decay if decay > 0 else t["steps"]  # the cosine's horizon (train.decay_steps)
    return t


def lr_at(o, step):  # src/engine/update.cpp lr_at
    if o["warmup_steps"] > 0 and step <= o["warmup_steps"]:
        return o["lr"] * step / o["warmup_steps"]
    decay = o["decay_steps"] - o["warmup_steps"]
    if decay <= 0:
        return o["lr"]
    t = min(1.0, (step - o["warmup_steps"]) / decay)
    floor = o["lr"] * o["min_lr_ratio"]
    return floor + 0.5 * (o["lr"] - floor) * (1.0 + math.cos(math.pi * t))


def head_weight(head):
    """The LM head's weight; under peft's modules_to_save, the trained copy."""
    if hasattr(head, "modules_to_save") and "default" in getattr(head, "modules_to_save", {}):
        return head.modules_to_save["default"].weight
    return head.weight


def step_loss(model, batch, dev, autocast, backward):
    """Sum of the segments' cross-entropies / the step's targets; gradients accumulate when asked."""
    n = batch["targets"]
    total = 0.0
    for seg in batch["segments"]:
        ids = torch.tensor([seg["tokens"]], device=dev)
        tg = torch.tensor(seg["targets"], device=dev)
        if int((tg >= 0).sum()) == 0:
            continue
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            h = model.model(input_ids=ids).last_hidden_state[0]  # (T, C) after the final norm
        # The LM head as ours: bf16 inputs, fp32 products and logits (autocast would round the
        # logits to bf16); the tied head's weight is the embedding, so its gradient reaches it.
        w = head_weight(model.lm_head)
        if autocast:
            h, w = h.bfloat16().float(), w.bfloat16().float()
        logits = F.linear(h.float(), w)
        loss = F.cross_entropy(logits, tg, ignore_index=-1, reduction="sum") / n
        if backward:
            loss.backward()
        total += float(loss.detach())
        del h, w, logits, loss
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--adapter", help="a PEFT LoRA adapter directory on top of --hf (LoRA runs)")
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast in the trajectory (our CPU engine)")
    a = ap.parse_args()
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    batches = [json.loads(line) for line in open(a.batches)]
    ours = read_steps(a.metrics)
    o = read_optim(a.checkpoint)
    kw = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
    model, info = AutoModelForCausalLM.from_pretrained(a.hf, attn_implementation="sdpa", output_loading_info=True, **kw)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{a.hf}: transformers reports {bad}")
    if a.adapter:
        import peft
        model = peft.PeftModel.from_pretrained(model, a.adapter, is_trainable=True).get_base_model()
        print(f"peft {peft.__version__}: adapter {a.adapter}, "
              f"{sum(p.numel() for p in model.parameters() if p.requires_grad)} trainable parameters")
    model.to(dev).train()
    print(f"transformers {transformers.__version__} torch {torch.__version__}: {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters; optimizer {o}")
    res = {"hf": a.hf, "optim": o, "steps": []}

    # (a) the dense loss of step 1's documents at the initial weights
    first = min(ours)
    with torch.no_grad():
        l32 = step_loss(model, batches[0], dev, False, False)
        l16 = step_loss(model, batches[0], dev, True, False)
    ref = ours[first]["loss"]
    print(f"(a) step {batches[0]['step']} documents at the initial weights: ours {ref:.6f}  pytorch fp32 {l32:.6f} "
          f"(rel {abs(l32 - ref) / ref:.2e})  pytorch bf16 autocast {l16:.6f} (rel {abs(l16 - ref) / ref:.2e})")
    res["dense_loss"] = {"ours": ref, "torch_fp32": l32, "torch_bf16": l16, "tokens": sum(len(s["tokens"]) for s in batches[0]["segments"])}

    # (b) the trajectory
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() lists a tied head once
    names = {id(p): n for n, p in model.named_parameters()}
    decay = [p for p in params if "norm" not in names[id(p)] and not names[id(p)].endswith(".bias")]
    no_decay = [p for p in params if "norm" in names[id(p)] or names[id(p)].endswith(".bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["adam_eps"], foreach=True)
    print(f"{'step':>4} {'ours loss':>10} {'torch loss':>10} {'rel':>8} {'ours |g|':>10} {'torch |g|':>10} {'lr':>10}")
    for i, b in enumerate(batches[:a.steps]):
        s = b["step"]
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        loss = step_loss(model, b, dev, not a.fp32, True)
        gn = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None))
        if math.isfinite(gn) and o["grad_clip"] > 0 and gn > o["grad_clip"]:
            c = o["grad_clip"] / gn
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(c)
        lr = lr_at(o, s)
        for g in opt.param_groups:
            g["lr"] = lr
        if math.isfinite(loss) and math.isfinite(gn):
            opt.step()
        torch.cuda.synchronize()
        us = ours.get(s, {})
        rel = abs(loss - us["loss"]) / max(abs(us["loss"]), 1e-12) if us else float("nan")
        print(f"{s:>4} {us.get('loss', float('nan')):>10.4f} {loss:>10.4f} {rel:>8.1e} {us.get('grad_norm', float('nan')):>10.3f} "
              f"{gn:>10.3f} {lr:>10.3e}  ({time.time() - t0:.1f} s)")
        res["steps"].append({"step": s, "ours_loss": us.get("loss"), "torch_loss": loss, "ours_grad_norm": us.get("grad_norm"),
                             "torch_grad_norm": gn, "lr": lr, "ours_lr": us.get("lr")})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
