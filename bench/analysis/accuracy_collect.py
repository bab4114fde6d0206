#!/usr/bin/env python3
"""The accuracy recipe's evaluations -> one CSV (the curve) and a summary JSON.

usage: accuracy_collect.py RUNS --stages pre,short,long [--from 8193] --csv OUT.csv --summary OUT.json

Reads RUNS/eval/<stage>_<step>.json (`sparsebalance eval --summary`) and RUNS/metrics_<stage>.h5
(the tokens each step trained on; a stage starts where the previous one ended; without h5py,
steps x --batch STAGE=TOKENS). One CSV row per
(checkpoint, attention dense|sparse, length range, task):
  stage,step,tokens,attention,lengths,task,correct,total,accuracy,loss,loss_masked
lengths: each eval bucket (e.g. "8193-12288", ">12288"), "all", and "target" = every bucket whose
lower bound is >= --from (the evaluated 8K-16K range). loss / loss_masked: the dense eval loss over
all tokens / over the answers (loss mask), the same on every row of a checkpoint.
The summary: the last checkpoint's rows at "target" and the recipe's goals (passkey >= 0.9,
overall >= 0.7, dense).
"""
import argparse
import csv
import json
import os
import re
import sys

try:
    import h5py
except ImportError:  # a machine without h5py: tokens = step x --batch
    h5py = None

TASKS = ("passkey", "multikey", "kv", "overall")


def stage_tokens(path, batch, steps):
    """{step: cumulative tokens within the stage} from a metrics log; without h5py (or the log)
    step x batch for the evaluated steps."""
    if h5py is None or not os.path.exists(path):
        return {s: s * batch for s in steps} if batch else {}
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        s = f["steps"][:]
    out, acc = {}, 0
    for step, tok in zip(s["step"], s["tokens"]):
        acc += int(tok)
        out[int(step)] = acc
    return out


def lower_bound(name):
    if name.startswith(">"):
        return int(name[1:]) + 1
    return int(name.split("-")[0])


def add_counts(dst, src):
    for t, v in src.items():
        d = dst.setdefault(t, {"correct": 0, "total": 0})
        d["correct"] += v["correct"]
        d["total"] += v["total"]


def rows_of(ev, stage, step, tokens, lo):
    out = []
    for att, key in (("dense", "task_accuracy"), ("sparse", "task_accuracy_sparse")):
        ranges = [("all", ev[key])]
        target = {}
        for b in ev["buckets"]:
            ranges.append((b["lengths"], b.get(key, {})))
            if lower_bound(b["lengths"]) >= lo:
                add_counts(target, b.get(key, {}))
        ranges.append(("target", target))
        for name, tasks in ranges:
            for t in TASKS:
                c = tasks.get(t, {"correct": 0, "total": 0})
                if not c["total"]:
                    continue
                out.append({"stage": stage, "step": step, "tokens": tokens, "attention": att, "lengths": name,
                            "task": t, "correct": c["correct"], "total": c["total"],
                            "accuracy": round(c["correct"] / c["total"], 4), "loss": round(ev["loss"], 5),
                            "loss_masked": round(ev.get("loss_masked", 0.0), 5)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs")
    ap.add_argument("--stages", required=True)
    ap.add_argument("--from", dest="lo", type=int, default=8193, help="lower bound of the target length range")
    ap.add_argument("--batch", default="", help="STAGE=TOKENS,...: tokens per step where h5py is missing")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--summary", required=True)
    a = ap.parse_args()
    rows, offset = [], 0
    batch = {k: int(v) for k, v in (x.split("=") for x in a.batch.split(",") if x)}
    for stage in a.stages.split(","):
        evs = []
        for name in os.listdir(os.path.join(a.runs, "eval")):
            m = re.fullmatch(rf"{re.escape(stage)}_(\d+)\.json", name)
            if m:
                evs.append((int(m.group(1)), name))
        tok = stage_tokens(os.path.join(a.runs, f"metrics_{stage}.h5"), batch.get(stage, 0), [s for s, _ in evs])
        for step, name in sorted(evs):
            with open(os.path.join(a.runs, "eval", name)) as f:
                ev = json.load(f)
            rows += rows_of(ev, stage, step, offset + tok.get(step, 0), a.lo)
        if tok:
            offset += max(tok.values())
    if not rows:
        sys.exit(f"accuracy_collect.py: no evaluation in {a.runs}/eval with task documents (stages {a.stages})")
    tmp = a.csv + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, a.csv)
    last = rows[-1]
    final = [r for r in rows if (r["stage"], r["step"]) == (last["stage"], last["step"]) and r["lengths"] == "target"]
    acc = {f"{r['attention']}_{r['task']}": r["accuracy"] for r in final}
    summary = {"stage": last["stage"], "step": last["step"], "tokens": last["tokens"], "target_lengths": f">={a.lo}",
               "accuracy": acc, "counts": {f"{r['attention']}_{r['task']}": [r["correct"], r["total"]] for r in final},
               "loss": last["loss"], "loss_masked": last["loss_masked"],
               "goal_passkey_0.9": acc.get("dense_passkey", 0) >= 0.9, "goal_overall_0.7": acc.get("dense_overall", 0) >= 0.7}
    with open(a.summary + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(a.summary + ".tmp", a.summary)
    print(f"accuracy at lengths >= {a.lo} ({last['stage']} step {last['step']}, {last['tokens']} tokens): " +
          ", ".join(f"{k} {v:.3f}" for k, v in acc.items()))
    print(f"goals (dense): passkey >= 0.9 {'met' if summary['goal_passkey_0.9'] else 'NOT met'}, "
          f"overall >= 0.7 {'met' if summary['goal_overall_0.7'] else 'NOT met'}")


if __name__ == "__main__":
    main()
