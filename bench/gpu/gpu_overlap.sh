#!/usr/bin/env bash
# The gradient all-reduce overlapped with the step's last backward pass (train.overlap_reduce =
# true, the default) against the same all-reduce after it (false), on NGPU GPUs of one node, one
# rank per GPU (NCCL). configs/gpu_0p5b.toml (0.47B parameters: 1.87 GB of fp32 gradients per step),
# dense attention at a short context L (default 2048) so that the all-reduce is a visible share of a
# step; 2 micro-batches per rank, STEPS steps, the two settings alternating ROUNDS times. Prints
# the median step time of steps 3.. (median over rounds) and off/on; logs and summaries in $OUT.
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh (stage `overlap` runs it):
#   NGPU=2 L=2048 STEPS=10 ROUNDS=2 SB=build-gpu/src/sparsebalance OUT=gpu-out bash bench/gpu/gpu_overlap.sh
# A dry run on the CPU (checks the script, measures nothing): EXTRA="--set train.device=cpu
#   --set model.n_layers=2 --set model.d_model=64 --set model.n_heads=1 --set model.n_kv_heads=1
#   --set model.ffn_dim=128" NGPU=2 L=256 STEPS=3 ROUNDS=1 SB=build/src/sparsebalance bash bench/gpu/gpu_overlap.sh
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
L=${L:-2048}
STEPS=${STEPS:-10}
ROUNDS=${ROUNDS:-2}
[ "$NGPU" -ge 1 ] || { echo "gpu_overlap: no GPU (set NGPU)"; exit 2; }
source "$(dirname "$0")/gpu_mpi.sh"
R=runs/gpu_overlap
mkdir -p "$OUTDIR" $R
read -r -a EX <<< "${EXTRA:-}"
data=$R/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs $((NGPU * 2 * STEPS + 16)) --max-len "$L" \
  --min-len "$L" --output "$data" > "$OUTDIR/overlap_prep.log" 2>&1 || { cat "$OUTDIR/overlap_prep.log"; exit 1; }
for r in $(seq 1 "$ROUNDS"); do
  for ov in true false; do
    rm -rf $R/ckpt
    gpu_mpirun "$NGPU" "$SB" train configs/gpu_0p5b.toml --set data.path="$data" --set data.val_fraction=0 \
      --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((NGPU * 2 * L)) --set train.steps="$STEPS" \
      --set attention.mode=dense --set balance.tuning=fixed --set balance.self_profile=false \
      --set train.overlap_reduce=$ov --set checkpoint.dir=$R/ckpt --set log.path=$R/metrics_${ov}_$r.h5 "${EX[@]}" \
      --summary "$OUTDIR/overlap_${ov}_$r.json" > "$OUTDIR/overlap_${ov}_$r.log" 2>&1 \
      || { echo "gpu_overlap: train failed (overlap $ov, round $r):"; tail -20 "$OUTDIR/overlap_${ov}_$r.log"; exit 1; }
    grep -E "^device" "$OUTDIR/overlap_${ov}_$r.log" | head -1
  done
done
rm -rf $R/ckpt  # 5.6 GB of weights and moments
python3 - "$OUTDIR" "$ROUNDS" "$NGPU" "$L" <<'PY'
import json, statistics, sys
o, rounds, ngpu, L = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
med = {}
for ov in ("true", "false"):
    per = []
    for r in range(1, rounds + 1):
        s = json.load(open(f"{o}/overlap_{ov}_{r}.json"))
        per.append(statistics.median(s["step_ms"][2:] or s["step_ms"]))
    med[ov] = statistics.median(per)
    print(f"overlap_reduce={ov:5s}: step ms {med[ov]:8.2f}  (rounds: {', '.join(f'{x:.2f}' for x in per)})")
print(f"{ngpu} GPUs, L={L}: after/overlapped step time = {med['false'] / med['true']:.3f}")
PY
