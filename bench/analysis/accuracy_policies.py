#!/usr/bin/env python3
"""bench/gpu/accuracy_policies.sh's runs -> one CSV and Markdown tables for bench/results/ (2026-12-02-policy-comparison-gpu.md).

usage: accuracy_policies.py RUNS [--from 8193] --csv OUT.csv --md OUT.md

Reads RUNS/<policy>_s<seed>/{train.json,eval.json}, and RUNS/start/eval.json when there (the
starting checkpoint evaluated before any fine-tuning: the first rows of the tables, dense and sparse). CSV: one row per (policy, seed, attention of
the eval pass, length range, task) with the run's step time, mean recall, budgets above/below k0
and eval losses (lengths as in bench/analysis/accuracy_collect.py: buckets, "all", "target" = buckets from
--from up). Tables: per policy, mean +- sample standard deviation over seeds [min..max], accuracy
read with the policy's own attention (dense for "dense", sparse at k0 otherwise).
"""
import argparse
import csv
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accuracy_collect import TASKS, rows_of  # noqa: E402

ORDER = ["dense", "fixed", "dst_mean", "dst_max", "dst_recall", "dst_recall_true"]


def spread(xs, fmt="{:.3f}"):
    if not xs:
        return "-"
    m = statistics.mean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{fmt.format(m)} ± {fmt.format(sd)} [{fmt.format(min(xs))}..{fmt.format(max(xs))}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs")
    ap.add_argument("--from", dest="lo", type=int, default=8193)
    ap.add_argument("--csv", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    rows, runs = [], {}
    for name in sorted(os.listdir(a.runs)):
        m = re.fullmatch(r"(.+)_s(\d+)", name)
        d = os.path.join(a.runs, name)
        if not m or not os.path.exists(os.path.join(d, "eval.json")):
            continue
        pol, seed = m.group(1), int(m.group(2))
        with open(os.path.join(d, "train.json")) as f:
            tr = json.load(f)
        with open(os.path.join(d, "eval.json")) as f:
            ev = json.load(f)
        extra = {"policy": pol, "seed": seed, "step_ms": round(tr["mean_step_ms"], 2),
                 "mean_recall": round(tr["mean_recall"], 4), "mean_recall_true": round(tr.get("mean_recall_true", -1), 4),
                 "budgets_above_k0": tr["budgets_above_k0"],
                 "budgets_below_k0": tr["budgets_below_k0"], "loss_sparse": round(ev["loss_sparse"], 5),
                 "train_last_loss": round(tr["last_loss"], 5)}
        for r in rows_of(ev, "policy", tr["last_step"], 0, a.lo):
            del r["stage"], r["tokens"]
            rows.append({**extra, **r})
        runs.setdefault(pol, []).append((seed, tr, ev))
    if not rows:
        sys.exit(f"accuracy_policies.py: no finished run with task documents evaluated in {a.runs}")
    with open(a.csv + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(a.csv + ".tmp", a.csv)

    pols = [p for p in ORDER if p in runs] + sorted(p for p in runs if p not in ORDER)
    own = lambda p: "dense" if p == "dense" else "sparse"  # noqa: E731

    def acc(p, lengths, task):
        return [float(r["accuracy"]) for r in rows
                if r["policy"] == p and r["attention"] == own(p) and r["lengths"] == lengths and r["task"] == task]

    out = [f"Held-out exact match at lengths >= {a.lo} (the policy's own attention: dense for dense, sparse at k0 "
           f"otherwise); mean ± sd over seeds [min..max]:", "",
           "| policy | seeds | " + " | ".join(TASKS) + " | eval loss (dense) | eval loss (sparse) | "
           "loss on answers | mean recall (gate) | true recall | budgets >k0 / <k0 | step ms |",
           "|---|---:|" + "---:|" * (len(TASKS) + 7)]
    start_path = os.path.join(a.runs, "start", "eval.json")
    start = []  # (label, its rows) of the starting checkpoint, once per attention of the eval
    if os.path.exists(start_path):
        with open(start_path) as f:
            sev = json.load(f)
        srows = rows_of(sev, "start", sev.get("step", 0), 0, a.lo)
        start = [(f"start ({att} eval)", [r for r in srows if r["attention"] == att]) for att in ("dense", "sparse")]

    def start_acc(rs, lengths, task):
        return [float(r["accuracy"]) for r in rs if r["lengths"] == lengths and r["task"] == task]

    for label, rs in start:
        out.append(f"| {label} | - | " + " | ".join(spread(start_acc(rs, "target", t)) for t in TASKS) +
                   f" | {sev['loss']:.4f} | {sev['loss_sparse']:.4f} | {sev.get('loss_masked', 0.0):.4f} | - | - | - | - |")
    for p in pols:
        rs = runs[p]
        loss = [ev["loss"] for _, _, ev in rs]
        lsp = [ev["loss_sparse"] for _, _, ev in rs]
        lm = [ev.get("loss_masked", 0.0) for _, _, ev in rs]
        rec = [tr["mean_recall"] for _, tr, _ in rs]
        true = [tr["mean_recall_true"] for _, tr, _ in rs if tr.get("mean_recall_true", -1) >= 0]  # balance.recall_rows
        above = statistics.mean(tr["budgets_above_k0"] for _, tr, _ in rs)
        below = statistics.mean(tr["budgets_below_k0"] for _, tr, _ in rs)
        ms = [tr["mean_step_ms"] for _, tr, _ in rs]
        out.append(f"| {p} | {len(rs)} | " + " | ".join(spread(acc(p, "target", t)) for t in TASKS) +
                   f" | {spread(loss, '{:.4f}')} | {spread(lsp, '{:.4f}')} | {spread(lm, '{:.4f}')} | "
                   f"{spread(rec)} | {spread(true) if true else '-'} | {above:.0f} / {below:.0f} | {spread(ms, '{:.1f}')} |")
    buckets = []
    for r in rows:
        if r["lengths"] not in ("all", "target") and r["lengths"] not in buckets:
            buckets.append(r["lengths"])
    out += ["", "Overall exact match per document length (same reading):", "",
            "| policy | " + " | ".join(buckets) + " | all |", "|---|" + "---:|" * (len(buckets) + 1)]
    for label, rs in start:
        out.append(f"| {label} | " + " | ".join(spread(start_acc(rs, b, "overall")) for b in buckets + ["all"]) + " |")
    for p in pols:
        out.append(f"| {p} | " + " | ".join(spread(acc(p, b, "overall")) for b in buckets + ["all"]) + " |")
    out += ["", "Step times: ranks sharing one device, budgets planned from a one-rank latency profile "
            "(balance.ema = 0): they order the policies by planned work; not speed figures."]
    with open(a.md + ".tmp", "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(a.md + ".tmp", a.md)
    print("\n".join(out))


if __name__ == "__main__":
    main()
