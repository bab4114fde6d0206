#!/usr/bin/env python3
"""Launched against working CTAs of the wgmma attention backward with GQA (no GPU needed).

Mirrors, for bench_attention_cuda's masks (row_blocks: splitmix64, seed 1234), the rules that size
the backward's grid and make its CTAs leave: kernels/cuda/attention_bwd.cu column_split (GQA,
the automatic chunk (set_bwd_column_chunk(-1)): chunk = max(128, bound / 16) 64-query tiles, n_split = the group x the
chunks of the longest head column) and bwd_sm90_kernel's exits (a column is split if G x nq x 2 >
chunk; a split column's CTA s takes head s / m, chunk s % m, and leaves if that chunk starts past
the head's tiles; an unsplit column runs on piece 0 alone), and the compacted grid's size
(kernels/cuda/bwd_pieces.cu piece_bound, the default since 2026-12-06: the pieces with tiles run
first, the CTAs past their count leave at the end). Keep it in step with those three.
  /usr/bin/python3 bench/analysis/bwd_spare_ctas.py [--heads 14 --kv-heads 2 --dim 64] [--lens 16384]
      [--densities 1,0.5,0.25,0.1] [--sms 132]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from bench_masks import row_blocks  # noqa: E402 (bench/torch/bench_masks.py, beside the references)

def count(heads, kv_heads, dim, length, density):
    G, nb = heads // kv_heads, (length + 127) // 128
    qt = 128 if dim == 64 else 64  # query tile of the default kernel
    col = [0] * nb
    for i in range(nb):
        for j in row_blocks(i, density, 1234):
            col[j] += 1
    chunk = max(128, (G * nb * 2 + 15) // 16)
    n_split = G * max(1, (nb * 2 + chunk - 1) // chunk)
    m, kchunk, ksub = n_split // G, (chunk + qt // 64 - 1) // (qt // 64), 128 // qt
    work = 0
    for nq in col:
        if G * nq * 2 <= chunk:
            work += 1
        else:
            work += sum(1 for s in range(n_split) if (s % m) * kchunk < nq * ksub)
    items, kept = nb * kv_heads, sum(col) * kv_heads
    split_cols = min(items, 2 * G * kept // (chunk + 1))
    bound = min(items * n_split, items + (G * ksub * kept + kchunk - 1) // kchunk + G * split_cols)
    return n_split, chunk, items * n_split, work * kv_heads, bound


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64, choices=[64, 128])
    ap.add_argument("--lens", default="16384")
    ap.add_argument("--densities", default="1,0.5,0.25,0.1")
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    if a.kv_heads < 1 or a.heads % a.kv_heads or a.heads == a.kv_heads:
        ap.error("--kv-heads must divide --heads and be fewer (GQA: MHA splits by another rule)")
    print("| L | density | n_split | chunk | full grid | working | share | spare per SM | compacted grid "
          "| spare per SM |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for L in (int(x) for x in a.lens.split(",")):
        for d in (float(x) for x in a.densities.split(",")):
            ns, ch, launched, work, bound = count(a.heads, a.kv_heads, a.dim, L, d)
            print(f"| {L} | {d:g} | {ns} | {ch} | {launched} | {work} | {work / launched:.1%} | "
                  f"{(launched - work) / a.sms:.1f} | {bound} | {(bound - work) / a.sms:.1f} |")


if __name__ == "__main__":
    main()
