#!/usr/bin/python3
"""Plots of one SparseBalance training run, from its HDF5 metrics log (log.path).

usage: /usr/bin/python3 jobs/plots/plot_run.py METRICS.h5 [--out DIR] [--prefix NAME] [--title TEXT]

Writes four PNGs into DIR (default: the log's directory), named PREFIX_*.png (PREFIX default: the
log's file name without .h5):
  PREFIX_rank_time.png   per-rank time per step, compute and idle (the wait for the slowest rank)
                         stacked; one panel per rank up to 8 ranks, else the per-rank mean over steps
  PREFIX_budgets.png     attention budget k over steps: mean over ranks, the min and max over ranks
                         (of each rank's min/max over micro-batches x layers), and each rank's mean
  PREFIX_prediction.png  latency model: predicted vs measured compute time (scatter, every step x
                         rank, with y = x) and the mean relative error over steps
  PREFIX_loss.png        training loss (and learning rate) over steps
Needs h5py and matplotlib (Debian: python3-h5py python3-matplotlib; run with /usr/bin/python3).
The log may be read while the run goes on (SWMR).
"""
import argparse
import os
import sys

try:
    import h5py
    import numpy as np
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # a clear message instead of a traceback
    sys.exit(f"plot_run.py: needs h5py, numpy and matplotlib ({e}); on Debian: apt-get install python3-h5py "
             "python3-matplotlib, and run with /usr/bin/python3")


def read_log(path):
    """The /steps table (steps,) and the /ranks table (steps, ranks) as numpy structured arrays."""
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        for name in ("steps", "ranks"):
            if name not in f:
                raise SystemExit(f"plot_run.py: {path}: no /{name} table (not a SparseBalance metrics log?)")
            f[name].refresh()
        steps = f["steps"][()]
        ranks = f["ranks"][()]
    if ranks.ndim == 1:  # defensive: a flat table of steps x ranks rows
        n = len(np.unique(ranks["rank"])) if len(ranks) else 1
        ranks = ranks.reshape(-1, n)
    rows = min(len(steps), len(ranks))
    return steps[:rows], ranks[:rows]


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)


def plot_rank_time(steps, ranks, path, title):
    x = steps["step"]
    nr = ranks.shape[1]
    comp, idle = ranks["compute_ms"], ranks["idle_ms"]
    if nr <= 8:
        fig, axes = plt.subplots(nr, 1, figsize=(9, 1.2 + 1.6 * nr), sharex=True, sharey=True, squeeze=False)
        width = 0.85 if len(x) < 2 else 0.85 * float(np.min(np.diff(x)) if len(x) > 1 else 1)
        for r in range(nr):
            ax = axes[r, 0]
            ax.bar(x, comp[:, r], width=width, color="tab:blue", label="compute")
            ax.bar(x, idle[:, r], width=width, bottom=comp[:, r], color="tab:orange", label="idle (bubble)")
            ax.set_ylabel(f"rank {r}\nms")
            ax.grid(axis="y", alpha=0.3)
        axes[0, 0].legend(loc="upper right", fontsize=8, ncol=2)
        axes[-1, 0].set_xlabel("step")
        axes[0, 0].set_title(f"{title}: per-rank time per step (compute + idle)")
    else:
        fig, ax = plt.subplots(figsize=(max(6, 0.12 * nr), 4))
        r = np.arange(nr)
        ax.bar(r, comp.mean(0), color="tab:blue", label="compute")
        ax.bar(r, idle.mean(0), bottom=comp.mean(0), color="tab:orange", label="idle (bubble)")
        ax.set_xlabel("rank")
        ax.set_ylabel("ms per step (mean over steps)")
        ax.legend()
        ax.set_title(f"{title}: per-rank time per step, mean over {len(x)} steps")
    save(fig, path)


def plot_budgets(steps, ranks, path, title):
    x = steps["step"]
    fig, ax = plt.subplots(figsize=(9, 4))
    mean = ranks["mean_budget"]
    lo, hi = ranks["min_budget"].min(1), ranks["max_budget"].max(1)
    ax.fill_between(x, lo, hi, color="tab:green", alpha=0.2, label="min..max over ranks")
    if ranks.shape[1] <= 16:
        for r in range(ranks.shape[1]):
            ax.plot(x, mean[:, r], lw=0.8, alpha=0.6, label=f"rank {r} mean")
    ax.plot(x, mean.mean(1), color="k", lw=2, label="mean over ranks")
    ax.plot(x, lo, color="tab:green", lw=1, ls="--")
    ax.plot(x, hi, color="tab:green", lw=1, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel("attention budget k (blocks per row)")
    ax.set_title(f"{title}: budgets over steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="best")
    save(fig, path)


def plot_prediction(steps, ranks, path, title):
    pred, meas = ranks["predicted_ms"].ravel(), ranks["compute_ms"].ravel()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    sc = a.scatter(pred, meas, c=np.repeat(steps["step"], ranks.shape[1]), s=10, cmap="viridis")
    fig.colorbar(sc, ax=a, label="step")
    ok = np.isfinite(pred) & np.isfinite(meas)
    hi = max(float(np.max(pred[ok], initial=0)), float(np.max(meas[ok], initial=0)), 1e-9) * 1.05
    a.plot([0, hi], [0, hi], "k--", lw=1, label="measured = predicted")
    a.set_xlim(0, hi)
    a.set_ylim(0, hi)
    a.set_xlabel("predicted compute ms")
    a.set_ylabel("measured compute ms")
    a.set_title("every step x rank")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    x = steps["step"]
    b.plot(x, 100 * steps["pred_error"], color="tab:red", label="mean |pred - meas| / meas")
    b.plot(x, ranks["predicted_ms"].mean(1), color="tab:blue", ls="--", label="predicted ms (rank mean)")
    b.plot(x, ranks["compute_ms"].mean(1), color="tab:blue", label="measured ms (rank mean)")
    b.set_xlabel("step")
    b.set_ylabel("% error  /  ms")
    b.set_title("over steps")
    b.legend(fontsize=8, loc="best")
    b.grid(alpha=0.3)
    fig.suptitle(f"{title}: latency model, predicted vs measured compute")
    save(fig, path)


def plot_loss(steps, path, title):
    x = steps["step"]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(x, steps["loss"], color="tab:blue", marker="." if len(x) < 60 else None, label="loss")
    if "skipped" in steps.dtype.names and steps["skipped"].any():
        s = steps["skipped"] != 0
        ax.scatter(x[s], np.nan_to_num(steps["loss"][s]), color="red", marker="x", label="skipped step")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean next-token, nats)")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(x, steps["lr"], color="tab:gray", ls=":", label="lr")
    ax2.set_ylabel("learning rate")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper right")
    ax.set_title(f"{title}: loss")
    save(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="metrics log (HDF5, log.path of the run)")
    ap.add_argument("--out", help="output directory (default: the log's directory)")
    ap.add_argument("--prefix", help="file name prefix (default: the log's name without .h5)")
    ap.add_argument("--title", help="plot title (default: the prefix)")
    a = ap.parse_args(argv)
    if not os.path.exists(a.log):
        sys.exit(f"plot_run.py: {a.log}: no such file")
    steps, ranks = read_log(a.log)
    if len(steps) == 0:
        sys.exit(f"plot_run.py: {a.log}: the log has no steps yet")
    out = a.out or os.path.dirname(os.path.abspath(a.log))
    os.makedirs(out, exist_ok=True)
    prefix = a.prefix or os.path.splitext(os.path.basename(a.log))[0]
    title = a.title or prefix
    p = lambda name: os.path.join(out, f"{prefix}_{name}.png")
    plot_rank_time(steps, ranks, p("rank_time"), title)
    plot_budgets(steps, ranks, p("budgets"), title)
    plot_prediction(steps, ranks, p("prediction"), title)
    plot_loss(steps, p("loss"), title)
    print(f"plot_run.py: {len(steps)} steps x {ranks.shape[1]} ranks from {a.log}", file=sys.stderr)


if __name__ == "__main__":
    main()
