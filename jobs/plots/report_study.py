#!/usr/bin/python3
"""Report of a scaling or ablation study: results directory -> Markdown table + PNG plots.

usage: /usr/bin/python3 jobs/plots/report_study.py RESULTS_DIR [--out DIR] [--policies P,P,...|ablation] [--wide]

RESULTS_DIR holds study.json (written by jobs/slurm/{weak_scaling,strong_scaling,ablation}.sh or
bench/studies/scaling/simulate_study.sh) and the --summary JSON files it lists. By study.json "kind":
  weak      train summaries per rank count, tokens per rank fixed:
            throughput speedup = tok/s(N) / tok/s(N0); efficiency = speedup / (N / N0)
            (= per-rank throughput kept); plots weak_speedup.png, weak_efficiency.png
  strong    train summaries per rank count, global batch fixed: speedup = step time(N0) / step
            time(N); efficiency = speedup / (N / N0); plots strong_speedup.png, strong_efficiency.png
  ablation  train summaries per policy (batching+tuning), same ranks: step time, speedup vs
            sequential+fixed, imbalance, bubble, recall, final loss; plot ablation.png
  simulate  `sparsebalance simulate` summaries per preset x rank count: makespan, imbalance,
            bubble and plan time against ranks per policy; plots simulate_<preset>.png and
            simulate_<preset>_speedup.png (each policy's speedup vs sequential+fixed);
            --wide also writes report_wide.md (a compact row per rank count, the four ablation policies)
Writes report.md (the table(s)) and the PNGs into --out (default RESULTS_DIR) and prints the
Markdown. A point whose summary is missing (job failed or still running) is listed as missing.
Needs matplotlib (Debian python3-matplotlib; run with /usr/bin/python3).
"""
import argparse
import json
import math
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.exit(f"report_study.py: needs matplotlib ({e}); on Debian: apt-get install python3-matplotlib, "
             "run with /usr/bin/python3")

ABLATION = ["sequential+fixed", "sparse+fixed", "sequential+dst", "sparse+dst"]
ALL_POLICIES = [f"{b}+{t}" for b in ("sequential", "tokens", "quadratic", "sparse") for t in ("fixed", "dst")]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fmt(x, spec):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def study_points(res, study):
    pts = []
    for p in study.get("points", []):
        s = load(os.path.join(res, p["summary"]))
        pts.append(dict(p, s=s))
    return pts


# ---------------------------------------------------------------- train scaling (weak / strong)
def report_scaling(res, out, study):
    kind = study["kind"]
    pts = sorted(study_points(res, study), key=lambda p: p["ranks"])
    ok = [p for p in pts if p["s"]]
    lines = [f"## {kind} scaling: `{study.get('config', '')}`, {study.get('steps', '?')} steps"
             + (f", {study['tokens_per_rank']} tokens per rank" if "tokens_per_rank" in study else "")
             + (f", global batch {study['global_batch_tokens']} tokens" if "global_batch_tokens" in study else ""),
             "",
             f"command: `{study.get('command', '')}`; submitted {study.get('submitted', '?')} on {study.get('host', '?')}",
             "",
             "| ranks | job | steps | step ms | tok/s | speedup | efficiency | imbalance | bubble | final loss |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = ok[0] if ok else None
    xs, sp, ef = [], [], []
    for p in pts:
        s = p["s"]
        if not s:
            lines.append(f"| {p['ranks']} | {p.get('job', '')} | missing | | | | | | | |")
            continue
        n0 = base["ranks"]
        if kind == "strong":
            speed = base["s"]["mean_step_ms"] / s["mean_step_ms"] if s["mean_step_ms"] else float("nan")
        else:
            speed = s["tokens_per_s"] / base["s"]["tokens_per_s"] if base["s"]["tokens_per_s"] else float("nan")
        eff = speed / (p["ranks"] / n0)
        xs.append(p["ranks"]), sp.append(speed), ef.append(eff)
        lines.append(f"| {p['ranks']} | {p.get('job', '')} | {s['first_step']}..{s['last_step']} | "
                     f"{fmt(s['mean_step_ms'], '.1f')} | {fmt(s['tokens_per_s'], '.0f')} | {speed:.3f} | {eff:.3f} | "
                     f"{fmt(s['mean_imbalance'], '.3f')} | {fmt(s['mean_bubble'], '.3f')} | {fmt(s['last_loss'], '.4f')} |")
    what = "step time(N0)/step time(N)" if kind == "strong" else "tok/s(N)/tok/s(N0)"
    lines += ["", f"speedup = {what} with N0 = {base['ranks'] if base else '?'} ranks; efficiency = speedup / (N/N0). "
              "A requeued job's summary covers its last attempt only."]
    pngs = []
    if xs:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, sp, "o-", label="measured")
        ax.plot(xs, [x / xs[0] for x in xs], "k--", lw=1, label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_ylabel("speedup" + (" (throughput)" if kind == "weak" else ""))
        ax.set_title(f"{kind} scaling: speedup")
        ax.grid(alpha=0.3)
        ax.legend()
        pngs.append(save(fig, os.path.join(out, f"{kind}_speedup.png")))
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, ef, "o-", color="tab:green")
        ax.axhline(1, color="k", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, max(1.1, max(ef) * 1.1))
        ax.set_xlabel("ranks")
        ax.set_ylabel("parallel efficiency")
        ax.set_title(f"{kind} scaling: efficiency")
        ax.grid(alpha=0.3)
        pngs.append(save(fig, os.path.join(out, f"{kind}_efficiency.png")))
    return lines, pngs


# ---------------------------------------------------------------- train ablation
def report_ablation(res, out, study):
    pts = study_points(res, study)
    base = next((p["s"] for p in pts if p["name"] == "sequential+fixed" and p["s"]), None)
    lines = [f"## ablation: `{study.get('config', '')}`, {study.get('ranks', '?')} ranks, {study.get('steps', '?')} steps",
             "",
             f"command: `{study.get('command', '')}`; submitted {study.get('submitted', '?')} on {study.get('host', '?')}",
             "",
             "| policy | job | steps | step ms | speedup | tok/s | imbalance | bubble | density | recall | final loss |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    names, ms, speed, imb, bub = [], [], [], [], []
    for p in pts:
        s = p["s"]
        if not s:
            lines.append(f"| {p['name']} | {p.get('job', '')} | missing | | | | | | | | |")
            continue
        sp = base["mean_step_ms"] / s["mean_step_ms"] if base and s["mean_step_ms"] else float("nan")
        names.append(p["name"]), ms.append(s["mean_step_ms"]), speed.append(sp)
        imb.append(s["mean_imbalance"]), bub.append(s["mean_bubble"])
        lines.append(f"| {p['name']} | {p.get('job', '')} | {s['first_step']}..{s['last_step']} | "
                     f"{fmt(s['mean_step_ms'], '.1f')} | {fmt(sp, '.3f')} | {fmt(s['tokens_per_s'], '.0f')} | "
                     f"{fmt(s['mean_imbalance'], '.3f')} | {fmt(s['mean_bubble'], '.3f')} | "
                     f"{fmt(s['mean_density'], '.3f')} | {fmt(s['mean_recall'], '.4f')} | {fmt(s['last_loss'], '.4f')} |")
    lines += ["", "speedup = mean step time of sequential+fixed / this policy's."]
    pngs = []
    if names:
        fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
        for ax, vals, lab in zip(axes, (ms, speed, imb, bub),
                                 ("mean step ms", "speedup vs sequential+fixed", "imbalance (max/mean)", "bubble")):
            ax.bar(range(len(names)), vals, color=["tab:gray", "tab:blue", "tab:orange", "tab:green"][: len(names)]
                   + ["tab:purple"] * max(0, len(names) - 4))
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
            ax.set_title(lab)
            ax.grid(axis="y", alpha=0.3)
        axes[1].axhline(1, color="k", ls="--", lw=1)
        fig.suptitle(f"ablation, {study.get('ranks', '?')} ranks")
        pngs.append(save(fig, os.path.join(out, "ablation.png")))
    return lines, pngs


# ---------------------------------------------------------------- simulate study
def report_simulate(res, out, study, policies):
    pts = study_points(res, study)
    presets = []
    for p in pts:
        if p.get("preset") not in presets:
            presets.append(p.get("preset"))
    lines = [f"## simulate study: {', '.join(map(str, presets))}, {study.get('micro_batches', '?')} micro-batches per rank",
             "",
             f"command: `{study.get('command', '')}`; run {study.get('submitted', '?')} on {study.get('host', '?')}"
             + (f" ({study['machine']})" if study.get("machine") else ""),
             "",
             "makespan = slowest modelled rank's step (s); imbalance = max/mean rank time; bubble = idle share; "
             "plan ms = one real rank's planning work per step (make_plan + T* + its own DST); speedup vs "
             "sequential+fixed; steps = simulated steps averaged.", ""]
    pngs = []
    metrics = [("makespan", "makespan (s)", 1e-3), ("imbalance", "imbalance (max/mean)", 1),
               ("bubble", "bubble (idle share)", 1), ("plan_ms", "plan ms per step", 1)]
    for preset in presets:
        pp = sorted([p for p in pts if p.get("preset") == preset], key=lambda p: p["ranks"])
        lines += [f"### preset `{preset}`", "",
                  "| ranks | steps | policy | makespan (s) | imbalance | bubble | recall | speedup | vs LB | plan ms |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for p in pp:
            s = p["s"]
            if not s:
                lines.append(f"| {p['ranks']} | | missing | | | | | | | |")
                continue
            for name in policies:
                q = s["policies"].get(name)
                if not q:
                    continue
                lines.append(f"| {p['ranks']} | {s.get('steps', '')} | {name} | {q['makespan'] / 1e3:.2f} | "
                             f"{q['imbalance']:.4f} | {q['bubble']:.4f} | {q['recall']:.4f} | {q['speedup']:.3f} | "
                             f"{q['vs_lower_bound']:.4f} | {q['plan_ms']:.2f} |")
        lines.append("")
        ok = [p for p in pp if p["s"]]
        if not ok:
            continue
        fig, axes = plt.subplots(2, 2, figsize=(12, 8))
        for ax, (key, lab, scale) in zip(axes.ravel(), metrics):
            for name in policies:
                xs = [p["ranks"] for p in ok if name in p["s"]["policies"]]
                ys = [p["s"]["policies"][name][key] * scale for p in ok if name in p["s"]["policies"]]
                style = "-" if name in ABLATION else ":"
                ax.plot(xs, ys, style, marker="o", ms=4, label=name)
            if key == "makespan":
                ax.plot([p["ranks"] for p in ok], [p["s"]["lower_bound"] * 1e-3 for p in ok], "k--", lw=1,
                        label="lower bound")
            ax.set_xscale("log", base=2)
            if key == "plan_ms":
                ax.set_yscale("log")
            ax.set_xlabel("ranks")
            ax.set_ylabel(lab)
            ax.grid(alpha=0.3)
        axes[0, 0].legend(fontsize=7, ncol=2)
        fig.suptitle(f"simulate, preset {preset}: policies against ranks")
        pngs.append(save(fig, os.path.join(out, f"simulate_{preset}.png")))
        # speedup of each policy vs sequential+fixed, against ranks
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name in policies:
            xs = [p["ranks"] for p in ok if name in p["s"]["policies"]]
            ys = [p["s"]["policies"][name]["speedup"] for p in ok if name in p["s"]["policies"]]
            ax.plot(xs, ys, "-" if name in ABLATION else ":", marker="o", ms=4, label=name)
        ax.set_xscale("log", base=2)
        ax.axhline(1, color="k", lw=1, ls="--")
        ax.set_xlabel("ranks")
        ax.set_ylabel("speedup vs sequential+fixed")
        ax.set_title(f"simulate, preset {preset}: speedup of the balancer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        pngs.append(save(fig, os.path.join(out, f"simulate_{preset}_speedup.png")))
    return lines, pngs


def wide_simulate(res, study):
    """One compact table per preset: a row per rank count, the four ablation policies side by side."""
    pts = study_points(res, study)
    presets = []
    for p in pts:
        if p.get("preset") not in presets:
            presets.append(p.get("preset"))
    short = {"sequential+fixed": "seq+fix", "sparse+fixed": "SAB", "sequential+dst": "DST", "sparse+dst": "SAB+DST"}
    lines = []
    for preset in presets:
        pp = sorted([p for p in pts if p.get("preset") == preset and p["s"]], key=lambda p: p["ranks"])
        lines += [f"preset `{preset}` (makespan in s; imbalance = max/mean; bubble = idle share; plan = ms per "
                  "step per rank; speedup vs seq+fix)", "",
                  "| ranks | steps | makespan seq+fix / SAB / DST / SAB+DST | lower bound | imbalance seq+fix / SAB+DST "
                  "| bubble seq+fix / SAB+DST | speedup SAB / DST / SAB+DST | plan ms seq+fix / SAB+DST |",
                  "|---:|---:|---|---:|---|---|---|---|"]
        for p in pp:
            q = p["s"]["policies"]
            g = lambda n, k, f, sc=1: format(q[n][k] * sc, f) if n in q else "-"
            lines.append(f"| {p['ranks']} | {p['s'].get('steps', '')} | "
                         + " / ".join(g(n, "makespan", ".1f", 1e-3) for n in ABLATION)
                         + f" | {p['s']['lower_bound'] * 1e-3:.1f} | {g(ABLATION[0], 'imbalance', '.3f')} / "
                         f"{g(ABLATION[3], 'imbalance', '.4f')} | {g(ABLATION[0], 'bubble', '.3f')} / "
                         f"{g(ABLATION[3], 'bubble', '.4f')} | "
                         + " / ".join(g(n, "speedup", ".3f") for n in ABLATION[1:])
                         + f" | {g(ABLATION[0], 'plan_ms', '.2f')} / {g(ABLATION[3], 'plan_ms', '.1f')} |")
        lines.append("")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="results directory with study.json")
    ap.add_argument("--out", help="where report.md and the PNGs go (default: RESULTS)")
    ap.add_argument("--wide", action="store_true", help="simulate: also write report_wide.md, one compact row "
                                                          "per rank count with the four ablation policies")
    ap.add_argument("--policies", help="simulate: policies to show (default: all eight; 'ablation' = the four "
                                       "of the ablation)")
    a = ap.parse_args(argv)
    study = load(os.path.join(a.results, "study.json"))
    if not study:
        sys.exit(f"report_study.py: {a.results}/study.json missing or unreadable")
    out = a.out or a.results
    os.makedirs(out, exist_ok=True)
    kind = study.get("kind")
    if kind in ("weak", "strong"):
        lines, pngs = report_scaling(a.results, out, study)
    elif kind == "ablation":
        lines, pngs = report_ablation(a.results, out, study)
    elif kind == "simulate":
        pol = ALL_POLICIES if not a.policies else (ABLATION if a.policies == "ablation" else a.policies.split(","))
        lines, pngs = report_simulate(a.results, out, study, pol)
        if a.wide:
            with open(os.path.join(out, "report_wide.md"), "w") as f:
                f.write("\n".join(wide_simulate(a.results, study)) + "\n")
    else:
        sys.exit(f"report_study.py: unknown study kind {kind!r} in {a.results}/study.json")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    print(md)
    for p in pngs:
        print(p, file=sys.stderr)


if __name__ == "__main__":
    main()
