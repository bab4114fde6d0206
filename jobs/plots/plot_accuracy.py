#!/usr/bin/python3
"""Plots of task accuracy: the accuracy recipe's curve, and the policy comparison.

usage: /usr/bin/python3 jobs/plots/plot_accuracy.py curve ACCURACY.csv [--out PNG] [--title TEXT]
       /usr/bin/python3 jobs/plots/plot_accuracy.py policies POLICIES.csv [--out PNG] [--title TEXT]

curve:    bench/analysis/accuracy_collect.py's CSV -> held-out exact-match accuracy against training tokens,
          one line per task at the target lengths (dense solid, sparse at k0 dashed), the stage
          boundaries marked, and the masked eval loss on a second panel.
policies: bench/analysis/accuracy_policies.py's CSV -> overall accuracy at the target lengths against the
          step time, one point per policy (mean over seeds, error bars = min..max over seeds), each
          policy's accuracy read with its own attention (dense for "dense", sparse otherwise).
          The step times come from ranks sharing one device: they order the policies, they are
          not speed figures.
Needs matplotlib (Debian: python3-matplotlib; run with /usr/bin/python3).
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.exit(f"plot_accuracy.py: needs matplotlib ({e}); on Debian: apt-get install python3-matplotlib")


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def curve(rows, out, title):
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    colors = {"passkey": "tab:blue", "multikey": "tab:orange", "kv": "tab:green", "overall": "black"}
    for att, style in (("dense", "-"), ("sparse", "--")):
        for task, col in colors.items():
            pts = sorted((int(r["tokens"]), float(r["accuracy"])) for r in rows
                         if r["lengths"] == "target" and r["attention"] == att and r["task"] == task)
            if pts:
                ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], style, marker="o", ms=3, color=col,
                        label=f"{task} ({att})", lw=2 if task == "overall" else 1.3)
    loss = sorted({(int(r["tokens"]), float(r["loss_masked"]), float(r["loss"])) for r in rows})
    ax2.plot([p[0] / 1e6 for p in loss], [p[1] for p in loss], marker="o", ms=3, label="answers (loss mask)")
    ax2.plot([p[0] / 1e6 for p in loss], [p[2] for p in loss], marker="o", ms=3, label="all tokens")
    # Stage boundaries: where the previous stage's last evaluated checkpoint sits.
    last, order = {}, []
    for r in rows:
        if r["stage"] not in last:
            order.append(r["stage"])
        last[r["stage"]] = max(last.get(r["stage"], 0), int(r["tokens"]))
    for prev, st in zip(order, order[1:]):
        for a in (ax, ax2):
            a.axvline(last[prev] / 1e6, color="grey", lw=0.8, ls=":")
        ax.text(last[prev] / 1e6, 1.02, " " + st, fontsize=8, color="grey", ha="left", va="bottom")
    for y, lab in ((0.9, "passkey goal"), (0.7, "overall goal")):
        ax.axhline(y, color="red", lw=0.6, ls=":")
        ax.text(0.01, y, lab, fontsize=7, color="red", va="bottom", transform=ax.get_yaxis_transform())
    lengths = next((r for r in rows if r["lengths"] != "all"), None)
    ax.set_ylabel("exact match, held-out (target lengths)")
    ax.set_ylim(-0.02, 1.08)
    ax.legend(fontsize=7, ncol=2, loc="center right")
    ax.set_title(title or "task accuracy against training tokens")
    ax2.set_xlabel("training tokens (M)")
    ax2.set_ylabel("eval loss")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return lengths is not None


def policies(rows, out, title):
    by = defaultdict(list)  # policy -> [(step_ms, accuracy)] over seeds
    for r in rows:
        own = "dense" if r["policy"] == "dense" else "sparse"
        if r["lengths"] == "target" and r["task"] == "overall" and r["attention"] == own:
            by[r["policy"]].append((float(r["step_ms"]), float(r["accuracy"])))
    fig, ax = plt.subplots(figsize=(7, 5))
    order = ["dense", "fixed", "dst_mean", "dst_max", "dst_recall"]
    for pol, pts in sorted(by.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0])):
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        ax.errorbar(mx, my, xerr=[[mx - min(xs)], [max(xs) - mx]], yerr=[[my - min(ys)], [max(ys) - my]],
                    fmt="o", capsize=3, label=f"{pol} (n={len(pts)})")
        ax.scatter(xs, ys, s=8, alpha=0.4)
    ax.set_xlabel("step time, ms (ranks sharing one device: an ordering, not a speed figure)")
    ax.set_ylabel("overall exact match, held-out (target lengths)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title(title or "task accuracy against step time per policy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return bool(by)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["curve", "policies"])
    ap.add_argument("csv")
    ap.add_argument("--out")
    ap.add_argument("--title")
    a = ap.parse_args()
    rows = read(a.csv)
    if not rows:
        sys.exit(f"plot_accuracy.py: {a.csv}: no rows")
    out = a.out or os.path.splitext(a.csv)[0] + ".png"
    ok = (curve if a.kind == "curve" else policies)(rows, out, a.title)
    if not ok:
        sys.exit(f"plot_accuracy.py: {a.csv}: nothing to plot for '{a.kind}'")
    print(f"plot_accuracy.py: wrote {out}")


if __name__ == "__main__":
    main()
