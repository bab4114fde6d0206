#!/usr/bin/env bash
# Fusion A/B (issue 18 item 4; kernels/cuda/fused.cu): whole training steps of CONFIG at L tokens (as
# bench/gpu_phase_breakdown.sh runs it) under each SB_FUSE level of LEVELS, with SB_PHASE_TIMES=1
# (CUDA events per phase):
#   0  the unfused chains (residual copies + GEMM beta=1, separate norms, bf16 casts, two RoPE
#      launches, a dw pass), separate q/k/v and gate/up GEMMs;
#   1  the fused elementwise kernels, the same separate GEMMs;
#   2  (the default) also the packed projections: q|k|v in one GEMM and gate|up in one, forward and
#      backward (no beta=1 GEMMs adding into dxn).
# Prints per level tokens/s, the elementwise phase ("norm/rope/swiglu/residual") and the GEMM phase,
# median over steps 3.., their ratios to the first level, and every step's loss of each (they must
# agree to bf16 rounding). ROUNDS=2 alternates the levels twice (medians over the rounds).
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh (stage `fuse`):
#   L=32768 STEPS=8 bash bench/gpu_fuse_ab.sh
#   CONFIG=configs/qwen2.5-0.5b.toml MODE=dense L=16384 LEVELS="1 2" STEPS=6 bash bench/gpu_fuse_ab.sh
#   (BLOCK, K: the attention block and attention.k over CONFIG's, as bench/gpu_e2e.sh takes them)
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
CONFIG=${CONFIG:-configs/gpu_0p5b.toml}
MODE=${MODE:-sparse}
LEVELS=${LEVELS:-0 1 2}
L=${L:-32768}
STEPS=${STEPS:-8}
ROUNDS=${ROUNDS:-1}
mkdir -p "$OUTDIR" runs/gpu_e2e
att_sets=()  # BLOCK, K: the attention block and attention.k over CONFIG's (as bench/gpu_e2e.sh)
[ -n "${BLOCK:-}" ] && att_sets+=(--set attention.block_size="$BLOCK")
[ -n "${K:-}" ] && att_sets+=(--set attention.k="$K")
data=runs/gpu_e2e/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
    --output "$data" > /dev/null || exit 1
tuning=dst; prof=true; [ "$MODE" = dense ] && { tuning=fixed; prof=false; }  # dense: no latency model to fit
for r in $(seq 1 "$ROUNDS"); do
  for f in $LEVELS; do
    run=fuse${f}_r$r
    rm -rf runs/gpu_e2e/ckpt_$run
    SB_FUSE=$f SB_PHASE_TIMES=1 "$SB" train "$CONFIG" --set data.path="$data" --set data.val_fraction=0 "${att_sets[@]}" \
      --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set train.steps="$STEPS" \
      --set attention.mode="$MODE" --set balance.tuning=$tuning --set balance.self_profile=$prof \
      --set checkpoint.dir=runs/gpu_e2e/ckpt_$run \
      --set log.path=runs/gpu_e2e/metrics_$run.h5 --summary runs/gpu_e2e/$run.json \
      > "$OUTDIR/$run.log" 2>&1 || { echo "train failed (SB_FUSE=$f round $r):"; tail -20 "$OUTDIR/$run.log"; exit 1; }
    rm -rf runs/gpu_e2e/ckpt_$run
    grep "^phases" "$OUTDIR/$run.log" | tail -2
  done
done
python3 - "$OUTDIR" "$L" "$ROUNDS" "$CONFIG" "$MODE" $LEVELS <<'PY' | tee "$OUTDIR/fuse_ab.md"
import json, re, statistics, sys
out, L, rounds, config, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
levels = [int(x) for x in sys.argv[6:]]
EW, GEMM = "norm/rope/swiglu/residual", "gemm"
res = {}
for f in levels:
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
base = levels[0]
print(f"{config}, L={L}, {mode}, 2 micro-batches per step, median over steps 3.. ({rounds} round(s))\n")
print("| | " + " | ".join(f"SB_FUSE={f}" for f in levels) + " | " +
      " | ".join(f"{f} / {base}" for f in levels[1:]) + " |")
print("|---|" + "---:|" * (2 * len(levels) - 1))
rows = [("elementwise phase ms", lambda f: res[f][0]), ("GEMM phase ms (+ unfused residual copies)", lambda f: res[f][1]),
        ("elementwise + GEMM ms", lambda f: res[f][0] + res[f][1]), ("step ms", lambda f: res[f][2]),
        ("tokens/s", lambda f: 2 * L / (res[f][2] / 1e3))]
for name, get in rows:
    fmt = "{:,.0f}" if name == "tokens/s" else "{:.1f}"
    print(f"| {name} | " + " | ".join(fmt.format(get(f)) for f in levels) + " | " +
          " | ".join(f"{get(f) / get(base):.3f}" for f in levels[1:]) + " |")
print()
for f in levels:
    print(f"loss per step SB_FUSE={f}: " + " ".join(f"{x:.4f}" for x in res[f][3]))
worst = max(abs(x - y) / max(abs(x), 1e-9) for f in levels[1:] for x, y in zip(res[base][3], res[f][3]))
print(f"worst relative loss difference {worst:.2e} ({'OK' if worst < 1e-2 else 'TOO LARGE'}: bf16 rounding ~4e-3)")
PY
