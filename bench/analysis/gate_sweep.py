#!/usr/bin/env python3
"""Issue 48's gate table: one `sparsebalance eval` summary per gate variant of one dense-trained model
(bench/gpu/accuracy_gates.sh's read/VARIANT.json), as held-out exact match with sparse attention at k0,
per task, at lengths >= --from; the dense column is the same model read densely (the gate's ceiling).

  gate_sweep.py runs/gates_gpu/read --from 8193 --md read.md --best best
--best FILE gets the variant with the highest sparse overall accuracy among those without a `qmax`
part (their gating is too slow to train with); ties go to the earlier (cheaper) variant of the table.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accuracy_collect import TASKS, rows_of  # noqa: E402

ORDER = ["base", "kbounds", "ksub", "qmax", "qmax+kbounds", "base+w4", "base+dl1", "base+dl2", "kbounds+dl2"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("read")
    ap.add_argument("--from", dest="lo", type=int, default=8193)
    ap.add_argument("--md", required=True)
    ap.add_argument("--best")
    a = ap.parse_args()
    found = {f[:-5]: os.path.join(a.read, f) for f in os.listdir(a.read) if f.endswith(".json")}
    if not found:
        sys.exit(f"gate_sweep.py: no VARIANT.json in {a.read}")
    names = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)
    table, score = [], {}
    for n in names:
        with open(found[n]) as f:
            ev = json.load(f)
        acc = {(r["attention"], r["task"]): r for r in rows_of(ev, n, 0, 0, a.lo) if r["lengths"] == "target"}
        if ("sparse", "overall") not in acc:
            sys.exit(f"gate_sweep.py: {found[n]}: no task documents at lengths >= {a.lo}")
        cell = lambda att, t: (f"{acc[(att, t)]['correct']}/{acc[(att, t)]['total']} "  # noqa: E731
                               f"({100 * acc[(att, t)]['accuracy']:.1f}%)") if (att, t) in acc else "-"
        table.append(f"| {n} | " + " | ".join(cell("sparse", t) for t in TASKS) +
                     f" | {cell('dense', 'overall')} | {ev['loss_sparse']:.4f} |")
        score[n] = acc[("sparse", "overall")]["accuracy"]
    out = [f"Held-out exact match at lengths >= {a.lo}, read with sparse attention at k0 under each gate "
           "variant (bench/gpu/gate_variants.sh); dense: the same model read densely.", "",
           "| gate | " + " | ".join(f"{t} (sparse)" for t in TASKS) + " | overall (dense) | eval loss (sparse) |",
           "|---|" + "---:|" * (len(TASKS) + 2), *table]
    with open(a.md + ".tmp", "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(a.md + ".tmp", a.md)
    print("\n".join(out))
    trainable = [n for n in names if "qmax" not in n.split("+")]
    if a.best and trainable:
        best = max(trainable, key=lambda n: (score[n], -names.index(n)))
        with open(a.best, "w") as f:
            f.write(best + "\n")
        print(f"best trainable gate: {best} ({100 * score[best]:.1f}% sparse overall)")


if __name__ == "__main__":
    main()
