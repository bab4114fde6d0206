#!/usr/bin/env bash
# Per-phase GPU time of sparse training steps on one GPU (train.phase_times = true: CUDA events cut
# the stream into attention forward/backward, GEMMs, gating + selection, norms/RoPE/SwiGLU/residual,
# LM head + loss, optimizer, all-reduce; idle = the step's wall time outside them; see
# src/model/phase_clock_cuda.hpp). configs/gpu_0p5b.toml sparse at L tokens as bench/gpu/gpu_e2e.sh runs it.
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh (SB = the binary it built):
#   L=32768 STEPS=6 bash bench/gpu/gpu_phase_breakdown.sh
#   CONFIG=configs/qwen2.5-0.5b.toml MODE=dense L=16384 bash bench/gpu/gpu_phase_breakdown.sh
#     another shape (CONFIG), dense (MODE; tuning fixed) or sparse (tuning dst, the default); BLOCK
#     and K override CONFIG's attention block and attention.k (as bench/gpu/gpu_e2e.sh); GATE_QUERY,
#     GATE_KEY, GATE_SUB, DENSE_LAYERS set the gate mode and the hybrid layers
# One plain run (tokens/s) and one with the events; prints the per-step phase lines and a table
# ($OUT/phase_table.md): median over steps 3.. (the first two warm up). An A/B of two commits: run
# it on each (jobs/gpu/make_baseline.sh builds the other tree).
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
L=${L:-32768}
STEPS=${STEPS:-6}
CONFIG=${CONFIG:-configs/gpu_0p5b.toml}
MODE=${MODE:-sparse}
TUNING=dst; PROF=true; [ "$MODE" = dense ] && { TUNING=fixed; PROF=false; }  # dense: no latency model to fit
mkdir -p "$OUTDIR" runs/gpu_e2e
att_sets=()  # BLOCK, K: the attention block and attention.k over CONFIG's (as bench/gpu/gpu_e2e.sh)
[ -n "${BLOCK:-}" ] && att_sets+=(--set attention.block_size="$BLOCK")
[ -n "${K:-}" ] && att_sets+=(--set attention.k="$K")
# GATE_QUERY, GATE_KEY, GATE_SUB, DENSE_LAYERS: the gate mode and hybrid layers (kernels/README.md,
# "Gate modes"), e.g. GATE_QUERY=max GATE_KEY=bounds DENSE_LAYERS=last:2
[ -n "${GATE_QUERY:-}" ] && att_sets+=(--set attention.gate_query="$GATE_QUERY")
[ -n "${GATE_KEY:-}" ] && att_sets+=(--set attention.gate_key="$GATE_KEY")
[ -n "${GATE_SUB:-}" ] && att_sets+=(--set attention.gate_sub_blocks="$GATE_SUB")
[ -n "${DENSE_LAYERS:-}" ] && att_sets+=(--set attention.dense_layers="$DENSE_LAYERS")
data=runs/gpu_e2e/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
    --output "$data" > /dev/null || exit 1
# a plain run (tokens/s without the events) and one with train.phase_times
for pt in false true; do
  run=run_$pt
  rm -rf runs/gpu_e2e/ckpt_phase_$run
  "$SB" train "$CONFIG" --set data.path="$data" --set data.val_fraction=0 "${att_sets[@]}" --set train.phase_times=$pt \
    --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set train.steps="$STEPS" \
    --set attention.mode="$MODE" --set balance.tuning=$TUNING --set balance.self_profile=$PROF --set checkpoint.dir=runs/gpu_e2e/ckpt_phase_$run \
    --set log.path=runs/gpu_e2e/metrics_phase_$run.h5 --summary runs/gpu_e2e/phase_$run.json \
    > "$OUTDIR/phase_$run.log" 2>&1 || { echo "train failed (train.phase_times=$pt):"; tail -20 "$OUTDIR/phase_$run.log"; continue; }
  rm -rf runs/gpu_e2e/ckpt_phase_$run
  grep "^phases" "$OUTDIR/phase_$run.log"
done
python3 - "$OUTDIR" "$L" run <<'PY' | tee "$OUTDIR/phase_table.md"
import json, re, statistics, sys
out, L, sels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cols, table = None, {}
for sel in sels:
    try:
        lines = [l for l in open(f"{out}/phase_{sel}_true.log") if l.startswith("phases step")]
        summ = json.load(open(f"runs/gpu_e2e/phase_{sel}_false.json"))
        summ1 = json.load(open(f"runs/gpu_e2e/phase_{sel}_true.json"))
    except OSError:
        continue
    rows = []
    for l in lines:
        step = int(re.match(r"phases step (\d+)", l).group(1))
        parts = [p.strip() for p in l.split(":", 1)[1].split("|")]
        vals = [(p.rsplit(" ", 1)[0], float(p.rsplit(" ", 1)[1])) for p in parts if p]
        cols = [n for n, _ in vals]
        if step >= 3: rows.append([v for _, v in vals])
    if not rows: continue
    med = [statistics.median(r[i] for r in rows) for i in range(len(cols))]
    ms = statistics.median(summ["step_ms"][2:] or summ["step_ms"])
    ms1 = statistics.median(summ1["step_ms"][2:] or summ1["step_ms"])
    table[sel] = (med, ms, summ.get("mean_density", 0), ms1, summ["first_loss"], summ["last_loss"])
if cols:
    print(f"L={L}, median over steps 3.. (ms per step of 2 micro-batches)\n")
    print("| phase | ms |")
    print("|---|" + "---:|" * len(table))
    for i, c in enumerate(cols):
        print(f"| {c} | " + " | ".join(f"{table[s][0][i]:.1f}" for s in table) + " |")
    print("| step ms, events on (summary) | " + " | ".join(f"{table[s][3]:.1f}" for s in table) + " |")
    print("| step ms, plain run (summary) | " + " | ".join(f"{table[s][1]:.1f}" for s in table) + " |")
    print("| tokens/s | " + " | ".join(f"{2 * L / (table[s][1] / 1e3):,.0f}" for s in table) + " |")
    print("| density | " + " | ".join(f"{table[s][2]:.4f}" for s in table) + " |")
    print("| loss first -> last | " + " | ".join(f"{table[s][4]:.3f} -> {table[s][5]:.3f}" for s in table) + " |")
PY
