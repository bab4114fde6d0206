#!/usr/bin/env bash
# Fused elementwise kernels A/B (issue 18 item 4; kernels/cuda/fused.cu): configs/gpu_0p5b.toml sparse
# at L tokens (as bench/gpu_phase_breakdown.sh runs it), once with SB_FUSE=0 (the unfused chains:
# residual copies + GEMM beta=1 + separate norms, bf16 casts, two RoPE launches, dw pass) and once
# with SB_FUSE=1, both with SB_PHASE_TIMES=1 (CUDA events per phase). Prints per setting tokens/s,
# the elementwise phase ("norm/rope/swiglu/residual") and the GEMM phase (the unfused residual copies
# are counted there), median over steps 3.., the ratios, and every step's loss of both (they must
# agree to bf16 rounding). ROUNDS=2 alternates 0 1 0 1 (medians over the rounds).
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh (stage `fuse`):
#   L=32768 STEPS=8 bash bench/gpu_fuse_ab.sh
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
L=${L:-32768}
STEPS=${STEPS:-8}
ROUNDS=${ROUNDS:-1}
mkdir -p "$OUTDIR" runs/gpu_e2e
data=runs/gpu_e2e/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
    --output "$data" > /dev/null || exit 1
for r in $(seq 1 "$ROUNDS"); do
  for f in 0 1; do
    run=fuse${f}_r$r
    rm -rf runs/gpu_e2e/ckpt_$run
    SB_FUSE=$f SB_PHASE_TIMES=1 "$SB" train configs/gpu_0p5b.toml --set data.path="$data" --set data.val_fraction=0 \
      --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set train.steps="$STEPS" \
      --set attention.mode=sparse --set balance.tuning=dst --set checkpoint.dir=runs/gpu_e2e/ckpt_$run \
      --set log.path=runs/gpu_e2e/metrics_$run.h5 --summary runs/gpu_e2e/$run.json \
      > "$OUTDIR/$run.log" 2>&1 || { echo "train failed (SB_FUSE=$f round $r):"; tail -20 "$OUTDIR/$run.log"; exit 1; }
    rm -rf runs/gpu_e2e/ckpt_$run
    grep "^phases" "$OUTDIR/$run.log" | tail -2
  done
done
python3 - "$OUTDIR" "$L" "$ROUNDS" <<'PY' | tee "$OUTDIR/fuse_ab.md"
import json, re, statistics, sys
out, L, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
EW, GEMM = "norm/rope/swiglu/residual", "gemm"
res = {}
for f in (0, 1):
    ew, gm, ms, losses = [], [], [], None
    for r in range(1, rounds + 1):
        run = f"fuse{f}_r{r}"
        for l in open(f"{out}/{run}.log"):
            m = re.match(r"phases step (\d+) \(ms\):(.*)", l)
            if not m or int(m.group(1)) < 3: continue
            vals = {p.strip().rsplit(" ", 1)[0]: float(p.strip().rsplit(" ", 1)[1]) for p in m.group(2).split("|") if p.strip()}
            ew.append(vals[EW]); gm.append(vals[GEMM])
        s = json.load(open(f"runs/gpu_e2e/{run}.json"))
        ms += s["step_ms"][2:] or s["step_ms"]
        losses = losses or s["losses"]
    res[f] = (statistics.median(ew), statistics.median(gm), statistics.median(ms), losses)
print(f"L={L}, sparse, 2 micro-batches per step, median over steps 3.. ({rounds} round(s))\n")
print("| | SB_FUSE=0 | SB_FUSE=1 | fused / unfused |")
print("|---|---:|---:|---:|")
for i, name in enumerate(["elementwise phase ms", "GEMM phase ms (+ unfused residual copies)", "step ms"]):
    a, b = res[0][i], res[1][i]
    print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.3f} |")
a, b = res[0][0] + res[0][1], res[1][0] + res[1][1]
print(f"| elementwise + GEMM ms | {a:.1f} | {b:.1f} | {b / a:.3f} |")
ta, tb = 2 * L / (res[0][2] / 1e3), 2 * L / (res[1][2] / 1e3)
print(f"| tokens/s | {ta:,.0f} | {tb:,.0f} | {tb / ta:.3f} |")
la, lb = res[0][3], res[1][3]
worst = max(abs(x - y) / max(abs(x), 1e-9) for x, y in zip(la, lb))
print("\nloss per step SB_FUSE=0: " + " ".join(f"{x:.4f}" for x in la))
print("loss per step SB_FUSE=1: " + " ".join(f"{x:.4f}" for x in lb))
print(f"worst relative loss difference {worst:.2e} ({'OK' if worst < 1e-2 else 'TOO LARGE'}: bf16 rounding ~4e-3)")
PY
