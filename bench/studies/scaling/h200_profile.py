#!/usr/bin/python3
"""A latency profile for `simulate` from measurements on the H200 (device tool, 2026-11-29):

  attention (per layer, fwd+bwd): least-squares fit of t = c0 + c1*L + c2*kept_blocks*Bs^2 to the
      CUDA block-sparse attention benchmark (bench/studies/scaling/h200_attention.csv: 32 heads, head_dim
      128, bf16, block 128, L = 8K..64K, densities 1..0.1; our kernels, as measured);
  linear (whole model, fwd+bwd): 6 * N_matmul FLOPs per token at the bf16 GEMM rate measured on
      the same H200 (730 TFLOP/s, 8192^3, BUILD-NOTES.md) -- an upper bound on GEMM speed, so the
      attention share is, if anything, overstated for a real model;
  gating (per layer): 10 ns per causal block pair (not measured separately: the GPU gating kernel
      is not yet the production one); all-reduce: 0 (one node, overlapped).

Model: a 7B-class decoder (32 layers, d_model 4096, 32 heads, ffn 11008). Writes group /latency
in the format of io/latency_profile.hpp.   usage: h200_profile.py OUT.h5"""
import csv, os, sys

import h5py
import numpy as np

BS, LAYERS, D_MODEL, FFN = 128, 32, 4096, 11008
here = os.path.dirname(os.path.abspath(__file__))
rows = list(csv.DictReader(open(os.path.join(here, "h200_attention.csv"))))
L = np.array([float(r["L"]) for r in rows])
nb = np.ceil(L / BS)
kept = np.array([float(r["kept_frac"]) for r in rows]) * nb * (nb + 1) / 2
t = np.array([float(r["fwdbwd_ms"]) for r in rows])
A = np.stack([np.ones_like(L), L, kept * BS * BS], 1)
c_attn, *_ = np.linalg.lstsq(A, t, rcond=None)
err = np.abs(A @ c_attn - t) / t
matmul_params = LAYERS * (4 * D_MODEL * D_MODEL + 3 * D_MODEL * FFN)
linear_ms_per_token = 6 * matmul_params / 730e12 * 1e3
coeffs = np.array([c_attn, [0.0, 0.0, 10e-6], [0.0, linear_ms_per_token, 0.0], [0.0, 0.0, 0.0]])
with h5py.File(sys.argv[1], "w") as f:
    g = f.create_group("latency")
    for k, v in dict(format="sparsebalance-latency", device="NVIDIA H200 (attention measured; GEMM at measured peak)").items():
        g.attrs.create(k, v, dtype=h5py.string_dtype())
    for k, v in dict(version=1, n_layers=LAYERS, block_size=BS, local_blocks=1).items():
        g.attrs[k] = np.int64(v)
    g.attrs["density"] = 1.0
    g["coeffs"] = coeffs
    g["correction"] = np.ones(4)
    g["heldout_error"] = np.array([err.mean(), 0, 0, 0])
    g["samples"] = np.array([len(t), 0, 0, 0], dtype=np.int64)
print(f"attention per layer: c0 {c_attn[0]:.4g} ms, c1 {c_attn[1]:.4g} ms/token, c2 {c_attn[2]:.4g} ms/pair "
      f"({c_attn[2] * 1e9:.3f} ps per kept (query, key) pair); fit error mean {100 * err.mean():.1f}% max {100 * err.max():.1f}%")
print(f"linear: {linear_ms_per_token * 1e3:.1f} us/token (whole model); a 64K dense document spends "
      f"{100 * (c_attn[0] + c_attn[1] * 65536 + c_attn[2] * 512 * 513 / 2 * BS * BS) * LAYERS / ((c_attn[0] + c_attn[1] * 65536 + c_attn[2] * 512 * 513 / 2 * BS * BS) * LAYERS + linear_ms_per_token * 65536):.0f}% in attention")
