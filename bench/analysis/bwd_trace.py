#!/usr/bin/env python3
"""Where the wgmma attention backward's time goes, from bench_attention_cuda --trace FILE (per-CTA
timestamps, kernels/cuda/attention_cuda.hpp set_bwd_trace): for each (L, density), the share of
the SMs' time (SMs x the kernel's span) spent in its CTAs' tiles, before their first tile (K, V
and the first Q, dO stages landing), after their last (the last dQ, dK and dV out), between CTAs
on an SM (one ends, the next starts), and idle at the end (the last wave); the cycles of a CTA's
end (its last dQ product and staging, the waits for its bulk adds, the rest: dK, dV stores unless
they went out under the last dQ product by TMA stores); and the cycles a tile
from a fit of each CTA's loop cycles against its tile count (the intercept: what a CTA costs
beyond its tiles inside the loop).

  /usr/bin/python3 bench/analysis/bwd_trace.py TRACE.csv
"""
import csv
import sys
from collections import defaultdict


def fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my / mx if mx else 0.0, 0.0
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return a, my - a * mx


def summarize(rows):
    start_ns = min(r["start_ns"] for r in rows)
    end_ns = max(r["end_ns"] for r in rows)
    span_ns = end_ns - start_ns
    clk = sum(r["end_clk"] - r["start_clk"] for r in rows)
    ns = sum(r["end_ns"] - r["start_ns"] for r in rows)
    ghz = clk / ns if ns else float("nan")
    by_sm = defaultdict(list)
    for r in rows:
        by_sm[r["sm"]].append(r)
    n_sm = len(by_sm)
    total = n_sm * span_ns * ghz  # SM cycles in the span
    pro = sum(r["first_tile_clk"] - r["start_clk"] for r in rows)
    loop = sum(r["last_tile_clk"] - r["first_tile_clk"] for r in rows)
    epi = sum(r["end_clk"] - r["last_tile_clk"] for r in rows)
    gaps = lead = tail = 0.0
    for sm_rows in by_sm.values():
        sm_rows.sort(key=lambda r: r["start_clk"])
        for a, b in zip(sm_rows, sm_rows[1:]):
            gaps += b["start_clk"] - a["end_clk"]
        lead += (sm_rows[0]["start_ns"] - start_ns) * ghz
        tail += (end_ns - sm_rows[-1]["end_ns"]) * ghz
    n = len(rows)
    sub = [sum(r[b] - r[a] for r in rows) / n for a, b in
           (("last_tile_clk", "dq_staged_clk"), ("dq_staged_clk", "waited_clk"), ("waited_clk", "end_clk"))]
    per_tile, icpt = fit([r["tiles"] for r in rows], [r["last_tile_clk"] - r["first_tile_clk"] for r in rows])
    tiles = sum(r["tiles"] for r in rows)
    return {
        "ctas": len(rows), "sms": n_sm, "tiles": tiles, "span_ms": span_ns * 1e-6, "ghz": ghz,
        "loop": loop / total, "pro": pro / total, "epi": epi / total, "gaps": gaps / total,
        "lead": lead / total, "tail": tail / total, "per_tile": per_tile, "icpt": icpt,
        "sub": sub, "pro_cta": pro / len(rows), "epi_cta": epi / len(rows), "gap_cta": gaps / max(1, len(rows) - n_sm),
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    groups = defaultdict(list)
    need = ("L", "density", "start_ns", "end_ns", "sm", "tiles", "start_clk", "first_tile_clk", "last_tile_clk",
            "dq_staged_clk", "waited_clk", "end_clk")
    with open(sys.argv[1]) as f:
        rd = csv.DictReader(f)
        missing = [c for c in need if c not in (rd.fieldnames or [])]
        if missing:
            sys.exit(f"bwd_trace.py: {sys.argv[1]} is not a bench_attention_cuda --trace CSV (no column "
                     f"{', '.join(missing)})")
        for r in rd:
            key = (int(r["L"]), float(r["density"]))
            groups[key].append({k: int(v) for k, v in r.items() if k not in ("L", "density")})
    print(f"{'L':>6} {'dens':>5} {'CTAs':>6} {'tiles':>8} {'span ms':>8} {'GHz':>5} | {'tiles %':>7} {'before %':>8}"
          f" {'after %':>7} {'between %':>9} {'lead %':>6} {'last wave %':>11} | {'clk/tile':>8} {'fit +clk':>8}"
          f" {'before clk':>10} {'after clk':>9} {'(dQ / waits / rest)':>20} {'between clk':>11}")
    for (L, d), rows in sorted(groups.items()):
        s = summarize(rows)
        print(f"{L:>6} {d:>5.2f} {s['ctas']:>6} {s['tiles']:>8} {s['span_ms']:>8.3f} {s['ghz']:>5.2f} |"
              f" {100 * s['loop']:>7.1f} {100 * s['pro']:>8.1f} {100 * s['epi']:>7.1f} {100 * s['gaps']:>9.1f}"
              f" {100 * s['lead']:>6.1f} {100 * s['tail']:>11.1f} | {s['per_tile']:>8.0f} {s['icpt']:>8.0f}"
              f" {s['pro_cta']:>10.0f} {s['epi_cta']:>9.0f} {'/'.join(f'{x:.0f}' for x in s['sub']):>20}"
              f" {s['gap_cta']:>11.0f}")


if __name__ == "__main__":
    main()
