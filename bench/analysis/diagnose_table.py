#!/usr/bin/env python3
"""Render `sparsebalance eval --diagnose` JSON as Markdown tables (issue 48's diagnostics).

usage: diagnose_table.py DIAG.json [DIAG2.json ...] [--heads]

Per file: the task accuracy (exact match, teacher-forced) with dense attention, sparse at k0, the
oracle gate (the needle's key blocks forced into every row), one layer at a time dense (rest sparse)
and one layer at a time sparse (rest dense); then per layer (per kv head with --heads): the needle's
rank in the gate's mean-pooled score order among the row's causal blocks, the fraction of answer rows
whose gate kept every needle block, and true recall (the dense softmax mass on the kept blocks)
beside the gate's own estimate, on the answer rows and on sampled rows. Standard library only.
"""
import argparse
import json
import sys


def pct(acc):
    return "-" if acc is None else f"{100 * acc['accuracy']:.1f}% ({acc['correct']}/{acc['total']})"


def num(v, f="{:.3f}"):
    return "-" if v is None else f.format(v)


def render(d, heads):
    out = []
    a = d["accuracy"]
    out.append(f"`{d.get('checkpoint', '?')}` (step {d.get('step', '?')}): {d['docs']} task documents "
               f"({d['docs_with_needle']} with the needle in the window of {d['window']}), blocks of "
               f"{d['block_size']}, k0 = {d['k']}, local {d['local_blocks']}, theta {d['theta']}")
    out.append("")
    tasks = [t for t in ("passkey", "multikey", "kv", "overall") if t in a["dense"]]
    out.append("| attention | " + " | ".join(tasks) + " |")
    out.append("|---|" + "---|" * len(tasks))
    rows = [("dense", a["dense"]), ("sparse (k0)", a["sparse"]), ("oracle gate", a["oracle"])]
    rows += [(f"layer {i} dense, rest sparse", x) for i, x in enumerate(a["dense_layer"])]
    rows += [(f"layer {i} sparse, rest dense", x) for i, x in enumerate(a["sparse_layer"])]
    for name, x in rows:
        out.append(f"| {name} | " + " | ".join(pct(x.get(t)) for t in tasks) + " |")
    out.append("")
    out.append("| layer | head | needle rank | of causal blocks | needle kept | true recall (answer rows) | gate recall (answer rows) | true recall (sampled) | gate recall (sampled) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for l in d["layers"]:
        items = [("all", l)] + ([(h["head"], h) for h in l["heads"]] if heads else [])
        for name, x in items:
            out.append(f"| {l['layer']} | {name} | {num(x['needle_rank'], '{:.1f}')} | {num(x['candidates'], '{:.1f}')} | "
                       f"{num(x['needle_kept'])} | {num(x['recall_true_answer'])} | {num(x['recall_gate_answer'])} | "
                       f"{num(x['recall_true_sampled'])} | {num(x['recall_gate_sampled'])} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--heads", action="store_true", help="a row per kv head too")
    args = ap.parse_args()
    for i, f in enumerate(args.files):
        try:
            with open(f) as fh:
                d = json.load(fh)
            if i:
                print()
            print(render(d, args.heads))
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"diagnose_table.py: {f}: not an eval --diagnose JSON ({e})")


if __name__ == "__main__":
    main()
