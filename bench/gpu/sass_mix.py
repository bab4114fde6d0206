#!/usr/bin/env python3
"""Instruction mix and stall sites of one kernel from Nsight Compute's per-SASS-instruction export
(`ncu -i REPORT --page source --csv --print-source sass`, as bench/gpu/ncu_sass.sh writes it).

  python3 bench/gpu/sass_mix.py SASS.csv [--per N] [--top K]

Prints the executed warp instructions by opcode (the mnemonic before its first '.'), with their share
of all instructions and of the warp-stall samples, then the K instructions with the most stall
samples (address order index, executed count, samples, SASS). --per N divides the executed counts,
e.g. by the number of warp x tile iterations, to read instructions per warp per tile.
Standard library only (it runs on the GPU machine's python3 or here).
"""
import argparse
import collections
import csv
import sys


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # line 1: "Kernel Name",<name>; line 2: the header; then one row per SASS instruction
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        sys.exit(f"sass_mix: {path}: no 'Address' header row; expected ncu --page source --csv --print-source sass")
    hdr = rows[head]
    need = ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)")
    missing = [c for c in need if c not in hdr]
    if missing:
        sys.exit(f"sass_mix: {path}: missing columns {missing}; profile with --section SourceCounters")
    name = rows[0][1] if rows and len(rows[0]) > 1 and rows[0][0] == "Kernel Name" else "?"
    ix = {c: hdr.index(c) for c in need}
    out = []
    for r in rows[head + 1:]:
        if len(r) <= max(ix.values()):
            continue
        n = int(r[ix["Instructions Executed"]]) if r[ix["Instructions Executed"]].isdigit() else 0
        smp = int(r[ix["Warp Stall Sampling (All Samples)"]]) if r[ix["Warp Stall Sampling (All Samples)"]].isdigit() else 0
        out.append((r[ix["Source"]].strip(), n, smp))
    return name, out


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):  # predicate guard
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--per", type=float, default=1.0, help="divide executed counts by this (e.g. warp x tile iterations)")
    ap.add_argument("--top", type=int, default=15, help="stall sites to list")
    a = ap.parse_args()
    if a.per <= 0:
        sys.exit("sass_mix: --per must be > 0")
    name, ins = load(a.csv)
    total = sum(n for _, n, _ in ins)
    samples = sum(s for _, _, s in ins)
    if total == 0:
        sys.exit(f"sass_mix: {a.csv}: no executed instructions in the export")
    by_n, by_s = collections.Counter(), collections.Counter()
    for sass, n, s in ins:
        by_n[opcode(sass)] += n
        by_s[opcode(sass)] += s
    print(f"{name}\n{len(ins)} SASS instructions, {total:,} executed (warp level), {samples:,} stall samples"
          + (f"; counts / {a.per:g}" if a.per != 1 else ""))
    print(f"{'opcode':<14} {'executed':>14} {'% inst':>7} {'% samples':>9}")
    for op, n in by_n.most_common():
        print(f"{op:<14} {n / a.per:>14,.1f} {100 * n / total:>6.1f}% {100 * by_s[op] / max(samples, 1):>8.1f}%")
    print(f"\ntop {a.top} stall sites")
    print(f"{'index':>6} {'executed':>12} {'samples':>8}  SASS")
    for i, (sass, n, s) in sorted(enumerate(ins), key=lambda t: -t[1][2])[: a.top]:
        print(f"{i:>6} {n / a.per:>12,.2f} {s:>8}  {sass}")


if __name__ == "__main__":
    main()
