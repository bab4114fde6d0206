#!/usr/bin/env bash
# The PyTorch reference trajectory (issue 19) on the GPU machine, after jobs/gpu/build_on_gpu.sh:
#   CONFIG=configs/gpu_0p5b.toml L=16384 STEPS=10 bash bench/torch/torch_trajectory.sh
# 1. the data of the end-to-end benchmark (bench/gpu/gpu_e2e.sh: 24 documents of L tokens, 2 per step);
# 2. our initial weights: one dense step at lr 1e-12 (an update of ~1e-12 is below a float's ulp
#    at these weights: the step-1 checkpoint holds the init bit for bit), exported as an f32 HF dir;
# 3. `train --init-from` that dir for STEPS dense steps, every step's documents in log.batches;
# 4. bench/torch/torch_trajectory.py: (a) the dense loss of step 1's documents in transformers,
#    (b) the same STEPS in a plain PyTorch AdamW loop, beside our losses and gradient norms.
# Output in $OUT: traj.log, traj.json.
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
CONFIG=${CONFIG:-configs/gpu_0p5b.toml}
L=${L:-16384}
STEPS=${STEPS:-10}
R=${RUNS:-runs}/traj  # RUNS=/dev/shm: checkpoints in memory (bench/torch/hf_finetune.sh says why)
mkdir -p "$OUTDIR" $R
data=$R/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
  --output "$data" > /dev/null || exit 1
sets=(--set data.path="$data" --set data.val_fraction=0 --set train.micro_batch_tokens="$L"
      --set train.global_batch_tokens=$((2 * L)) --set attention.mode=dense --set balance.tuning=fixed
      --set balance.self_profile=false --set checkpoint.every=0 --set log.every=1)
rm -rf $R/ck0 $R/ck $R/init_hf
"$SB" train "$CONFIG" "${sets[@]}" --set train.steps=1 --set train.lr=1e-12 --set checkpoint.dir=$R/ck0 \
  --set log.path=$R/m0.h5 > "$OUTDIR/traj_init.log" 2>&1 || { tail -20 "$OUTDIR/traj_init.log"; exit 1; }
"$SB" convert $R/ck0/ckpt_00000001.h5 $R/init_hf --dtype f32 || exit 1
rm -rf $R/ck0
"$SB" train "$CONFIG" "${sets[@]}" --init-from $R/init_hf --set train.steps="$STEPS" --set checkpoint.dir=$R/ck \
  --set log.path=$R/m.h5 --set log.batches=$R/batches.jsonl > "$OUTDIR/traj_ours.log" 2>&1 \
  || { tail -20 "$OUTDIR/traj_ours.log"; exit 1; }
PYTHONUNBUFFERED=1 python3 bench/torch/torch_trajectory.py --hf $R/init_hf --batches $R/batches.jsonl --metrics $R/m.h5 \
  --checkpoint "$(ls $R/ck/ckpt_*.h5 | tail -1)" --steps "$STEPS" --json "$OUTDIR/traj.json" 2>&1 | tee "$OUTDIR/traj.log"
rm -rf $R/ck
