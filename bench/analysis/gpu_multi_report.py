#!/usr/bin/env python3
"""Tables of bench/gpu/gpu_multi.sh: per policy, the per-step error of the one-GPU latency fit, and the
multi-GPU against the one-GPU losses. Reads OUT/train_*.json, OUT/eval_*.json, RUNS/*/metrics.h5.
  python3 bench/analysis/gpu_multi_report.py OUT RUNS NGPU"""
import json
import os
import statistics
import sys

out, runs, ngpu = sys.argv[1], sys.argv[2], int(sys.argv[3])


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def steps_table(name):
    try:
        import h5py
        with h5py.File(os.path.join(runs, name, "metrics.h5"), "r") as f:
            return f["steps"][()]
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"(no metrics for {name}: {e})")
        return None


def steady(xs):  # steps 3.. (the first two include cuBLAS/NCCL/allocator warm-up)
    return xs[2:] if len(xs) > 3 else xs


policies = ["sequential+fixed", "sparse+fixed", "sequential+dst", "sparse+dst"]
rows = []
for p in policies:
    t, e = load(f"{out}/train_{p}.json"), load(f"{out}/eval_{p}.json")
    if t is None:
        print(f"{p}: no summary (failed)")
        continue
    st = steps_table(p)
    sm = steady(t["step_ms"])
    ms = statistics.mean(sm)
    tok = statistics.mean(steady(list(st["tokens"]))) if st is not None else t["tokens_per_s"] * ms / 1e3
    pe = statistics.mean(steady(list(st["pred_error"]))) if st is not None else t["mean_pred_error"]
    imb = statistics.mean(steady(list(st["imbalance"]))) if st is not None else t["mean_imbalance"]
    bub = statistics.mean(steady(list(st["bubble"]))) if st is not None else t["mean_bubble"]
    rows.append((p, t, e, ms, tok / (ms / 1e3), pe, imb, bub))

if rows:
    base = rows[0][3]
    print(f"### {ngpu} GPUs, one rank each, {rows[0][1]['steps']} steps (means over steps 3..)\n")
    print("| policy | step ms | speedup | imbalance | bubble | tokens/s | density | recall | pred. error | "
          "final loss | eval loss (sparse) | task acc. (sparse) | budgets >k0 / <k0 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p, t, e, ms, tps, pe, imb, bub in rows:
        el = f"{e['loss_sparse']:.4f}" if e else "-"
        acc = f"{e['task_accuracy_sparse']['overall']['accuracy']:.3f}" if e else "-"
        print(f"| {p} | {ms:.1f} | {base / ms:.3f} | {imb:.3f} | {bub:.3f} | {tps:,.0f} | {t['mean_density']:.3f} | "
              f"{t['mean_recall']:.3f} | {pe:.3f} | {t['last_loss']:.4f} | {el} | {acc} | "
              f"{t['budgets_above_k0']} / {t['budgets_below_k0']} |")
    print()

# The one-GPU fit on the multi-GPU run: per-step prediction error with and without online correction.
a, b = steps_table("sparse+dst"), steps_table("sparse+dst_ema0")
if a is not None and b is not None:
    print("### Prediction error per step, SAB+DST (latency model fitted on one GPU)\n")
    print("| step | " + " | ".join(str(int(s)) for s in a["step"]) + " |")
    print("|---|" + "---:|" * len(a) + "")
    print("| corrected online (ema 0.3) | " + " | ".join(f"{x:.3f}" for x in a["pred_error"]) + " |")
    print("| one-GPU fit alone (ema 0) | " + " | ".join(f"{x:.3f}" for x in b["pred_error"]) + " |")
    print(f"\nmean over steps 3..: corrected {statistics.mean(steady(list(a['pred_error']))):.3f}, "
          f"fit alone {statistics.mean(steady(list(b['pred_error']))):.3f}\n")

# Same global batch on one GPU: the losses agree to bf16 tolerance.
m, o = load(f"{out}/train_sequential+fixed.json"), load(f"{out}/train_sequential+fixed_1gpu.json")
if m and o:
    d = [abs(x - y) / abs(y) for x, y in zip(m["losses"], o["losses"])]
    worst = max(d)
    print(f"### {ngpu} GPUs against 1 GPU, same global batch (sequential+fixed)\n")
    print(f"losses over {len(d)} steps: worst relative difference {worst:.2e} (step {d.index(worst) + 1}), "
          f"mean {statistics.mean(d):.2e}; {ngpu}-GPU {m['first_loss']:.4f} -> {m['last_loss']:.4f}, "
          f"1-GPU {o['first_loss']:.4f} -> {o['last_loss']:.4f}; step ms {statistics.mean(steady(m['step_ms'])):.1f} "
          f"vs {statistics.mean(steady(o['step_ms'])):.1f}. {'PASS' if worst < 2e-2 else 'FAIL'} (bound 2e-2)\n")
synced = [p for p in policies + ["sparse+dst_ema0"] if load(f"{out}/train_{p}.json")]
print(f"parameters hashed equal on all ranks after every step (train.sync_check_every = 1) in: {', '.join(synced)}")
