#!/usr/bin/env bash
# Multi-GPU balancing run: `sparsebalance train configs/gpu_longtail.toml` with one rank per GPU
# (NCCL all-reduce) on a long-tail corpus, for the four balancing policies on the same data and
# steps, each evaluated on the GPUs; the latency model is fitted on ONE GPU first
# (`sparsebalance profile` with CUDA_VISIBLE_DEVICES=0) and every run predicts with it.
# Also: the same SAB+DST run with the online correction off (balance.ema = 0), so the per-step
# error is that of the one-GPU fit alone; and fixed/sequential on one GPU with the same global batch,
# whose losses the multi-GPU run must match to bf16 tolerance. Every run checks that all ranks hold
# bit-identical parameters after every step (train.sync_check_every = 1; a mismatch stops the run).
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh (stage `multi` calls this):
#   NGPU=2 STEPS=30 bash bench/gpu/gpu_multi.sh        # tables on stdout and in $OUT/gpu_multi.md
#   CFG=configs/gpu_0p5b.toml MAXLEN=65536 LONG=split NGPU=8 bash bench/gpu/gpu_multi.sh
#     another model (CFG; its micro-batch sets the global batch, 4 micro-batches per GPU), a corpus up
#     to MAXLEN tokens (default 16384) whose documents longer than a micro-batch are windowed
#     (LONG=window, the default) or split over ranks (LONG=split); RUNS the run directory
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
STEPS=${STEPS:-30}
DOCS=${DOCS:-4000}
CFG=${CFG:-configs/gpu_longtail.toml}
MAXLEN=${MAXLEN:-16384}
LONG=${LONG:-window}
R=${RUNS:-runs/gpu_multi}
source "$(dirname "$0")/gpu_mpi.sh"
# EXTRA: more --set flags for every command (a dry run of this script on CPU:
#   EXTRA="--set train.device=cpu --set model.n_layers=2 --set model.d_model=64 --set model.n_heads=1
#          --set model.ffn_dim=128 --set train.micro_batch_tokens=2048" DOCS=300 NGPU=2 bash bench/gpu/gpu_multi.sh)
read -r -a EX <<< "${EXTRA:-}"
MB=$(micro_batch_of "$CFG" "${EX[@]}") || { echo "gpu_multi: cannot read train.micro_batch_tokens of $CFG"; exit 2; }
GB=$((NGPU * 4 * MB))  # 4 micro-batches per GPU
mkdir -p "$OUTDIR" $R
log() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi topo -m > "$OUTDIR/topo.txt" 2>&1 || true

DATA=$R/data_$MAXLEN
[ -f $DATA/shard_00000.h5 ] || "$SB" prep synth --preset longalign --docs "$DOCS" --seed 7 --max-len "$MAXLEN" \
  --min-len 64 --output $DATA > "$OUTDIR/prep.log" 2>&1 || { cat "$OUTDIR/prep.log"; exit 1; }
COMMON=(--set data.path=$DATA --set data.long_docs=$LONG --set train.steps="$STEPS" --set train.global_batch_tokens=$GB)
COMMON+=("${EX[@]}")

log "profile on one GPU"
gpu_mpirun 1 "$SB" profile $CFG "${COMMON[@]}" --output $R/profile_1gpu.h5 \
  --summary "$OUTDIR/profile_1gpu.json" > "$OUTDIR/profile.log" 2>&1 || { tail -20 "$OUTDIR/profile.log"; exit 1; }
cat "$OUTDIR/profile.log"

run() {  # name, ranks, extra flags...
  local name=$1 np=$2; shift 2
  local dir=$R/$name
  rm -rf "$dir"; mkdir -p "$dir"
  log "train $name ($np GPU)"
  gpu_mpirun "$np" "$SB" train $CFG "${COMMON[@]}" --set balance.profile=$R/profile_1gpu.h5 \
    --set checkpoint.dir="$dir/ckpt" --set log.path="$dir/metrics.h5" "$@" --summary "$OUTDIR/train_$name.json" \
    > "$OUTDIR/train_$name.log" 2>&1 || { echo "train $name failed:"; tail -20 "$OUTDIR/train_$name.log"; return 1; }
  grep -E "^(device|latency|done)" "$OUTDIR/train_$name.log"
}
evaluate() {  # name
  local dir=$R/$1
  gpu_mpirun "$NGPU" "$SB" eval $CFG "${COMMON[@]}" --set checkpoint.dir="$dir/ckpt" --checkpoint latest \
    --summary "$OUTDIR/eval_$1.json" > "$OUTDIR/eval_$1.log" 2>&1 || { echo "eval $1 failed:"; tail -5 "$OUTDIR/eval_$1.log"; }
}

for p in sequential:fixed sparse:fixed sequential:dst sparse:dst; do
  b=${p%%:*}; t=${p##*:}
  run "$b+$t" "$NGPU" --set balance.batching=$b --set balance.tuning=$t && evaluate "$b+$t"
done
run "sparse+dst_ema0" "$NGPU" --set balance.batching=sparse --set balance.tuning=dst --set balance.ema=0
# One GPU cannot split: with LONG=split it takes every document whole (micro-batches of MAXLEN,
# layer recomputation); attention is per document, so the step's loss is the same to rounding.
one=(); [ "$LONG" = split ] && one=(--set data.long_docs=window --set train.micro_batch_tokens=$MAXLEN --set train.recompute=layer)
run "sequential+fixed_1gpu" 1 --set balance.batching=sequential --set balance.tuning=fixed "${one[@]}"
rm -rf $R/*/ckpt/*.h5.tmp

python3 bench/analysis/gpu_multi_report.py "$OUTDIR" "$R" "$NGPU" | tee "$OUTDIR/gpu_multi.md"
