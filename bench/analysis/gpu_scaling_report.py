#!/usr/bin/env python3
"""Tables of bench/gpu/gpu_scaling.sh from its summaries (OUT/scaling_NAME.json):
  weak / strong: tokens/s, step ms, imbalance, prediction error, peak GiB and efficiency
                 tokens/s(n) / (n x tokens/s(1)) per GPU count
  cp:            a long document split over n GPUs against one GPU whole: the largest relative
                 loss difference over the steps, time per token; and one GPU's windows
  zero:          train.zero = 0 against 1 on NGPU GPUs: peak GiB, optimizer state per rank, step ms
Step times are medians of steps 3.. (the first two include cuBLAS/NCCL/allocator warm-up).
  python3 bench/analysis/gpu_scaling_report.py OUT NGPU TOKENS_PER_GPU COUNT..."""
import json
import re
import statistics
import sys

out, ngpu, tpg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
counts = [int(c) for c in sys.argv[4:]]


def load(name):
    try:
        with open(f"{out}/scaling_{name}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def step_ms(s):
    xs = s["step_ms"]
    return statistics.median(xs[2:] if len(xs) > 3 else xs)


def tokens_per_step(s):  # as trained (the summary's tokens/s x mean step)
    return s["tokens_per_s"] * s["mean_step_ms"] / 1e3


def tokens_per_s(s):  # tokens per step / median step
    return tokens_per_step(s) / (step_ms(s) / 1e3)


def optimizer_mib(name):  # "optimizer state X MiB" (cuda) or "optimizer X MiB" (cpu) of the memory line
    try:
        m = re.search(r"optimizer(?: state)? ([0-9.]+) MiB", open(f"{out}/scaling_{name}.log").read())
        return float(m.group(1)) if m else float("nan")
    except OSError:
        return float("nan")


def scaling(kind):
    if all(load(f"{kind}_{n}") is None for n in counts):
        return  # not run (PARTS)
    rows, base = [], None
    for n in counts:
        s = load(f"{kind}_{n}")
        if s is None:
            rows.append(f"| {n} | failed | | | | | |")
            continue
        tps = tokens_per_s(s)
        if n == 1:
            base = tps
        eff = f"{tps / (n * base):.3f}" if base else "n/a (no 1-GPU run)"
        rows.append(f"| {n} | {tps:,.0f} | {step_ms(s):.1f} | {s['mean_imbalance']:.3f} | "
                    f"{s['mean_pred_error']:.3f} | {s['peak_mem_gib']:.2f} | {eff} |")
    if not rows:
        return
    what = "tokens per GPU fixed" if kind == "weak" else "global batch fixed"
    print(f"\n### {kind} scaling ({what}: {tpg if kind == 'weak' else ngpu * tpg} tokens "
          f"{'per GPU' if kind == 'weak' else 'a step'}; SAB + DST, latency model fitted on one GPU)\n")
    print("| GPUs | tokens/s | step ms | imbalance | prediction error | peak GiB | efficiency |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


def context_parallel():
    whole = load("cp_whole_1")
    if whole is None and load("cp_window_1") is None:
        return
    print("\n### context parallelism: one long document a step\n")
    print("| run | GPUs | step ms | ms per 1K tokens | max rel loss diff vs whole | peak GiB |")
    print("|---|---:|---:|---:|---:|---:|")
    names = [("cp_whole_1", 1, "one GPU, whole (layer recomputation)"),
             ("cp_window_1", 1, f"one GPU, windows of 1/{ngpu}")]
    names += [(f"cp_part_{n}", n, f"split over {n}") for n in counts if n >= 2]
    for name, n, label in names:
        s = load(name)
        if s is None:
            print(f"| {label} | {n} | failed | | | |")
            continue
        tokens = tokens_per_step(s)
        per_k = step_ms(s) / (tokens / 1e3) if tokens > 0 else float("nan")
        diff = "(windows: other attention)" if name == "cp_window_1" else "-"
        if whole is not None and name.startswith("cp_part"):
            d = [abs(a - b) / abs(b) for a, b in zip(s["losses"], whole["losses"]) if b]
            diff = f"{max(d):.2e}" if d else "-"
        print(f"| {label} | {n} | {step_ms(s):.1f} | {per_k:.2f} | {diff} | {s['peak_mem_gib']:.2f} |")


def zero():
    if load(f"zero0_{ngpu}") is None and load(f"zero1_{ngpu}") is None:
        return
    rows = []
    for z in (0, 1):
        s = load(f"zero{z}_{ngpu}")
        if s is None:
            rows.append(f"| {z} | failed | | | |")
            continue
        rows.append(f"| {z} | {s['peak_mem_gib']:.2f} | {optimizer_mib(f'zero{z}_{ngpu}'):.1f} | {step_ms(s):.1f} | "
                    f"{s['first_loss']:.4f} -> {s['last_loss']:.4f} |")
    print(f"\n### ZeRO-1 on {ngpu} GPUs\n")
    print("| train.zero | peak GiB | optimizer state per rank (MiB) | step ms | loss first -> last |")
    print("|---:|---:|---:|---:|---|")
    print("\n".join(rows))


scaling("weak")
scaling("strong")
context_parallel()
zero()
