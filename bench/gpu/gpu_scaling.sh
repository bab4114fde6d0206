#!/usr/bin/env bash
# Scaling on the GPUs of one host (issue 23), one rank per GPU (NCCL), every run with the latency
# model fitted on ONE GPU:
#   weak    SAB + DST on 1, 2, 4, .. NGPU GPUs, the same tokens per GPU (TPG) each step:
#           efficiency = tokens/s(n) / (n x tokens/s(1))
#   strong  the same global batch (NGPU x TPG) on every count: efficiency as above
#   cp      one CP_LEN-token document a step split over 2, 4, .. NGPU GPUs (data.long_docs =
#           split) against one GPU training it whole (train.recompute = layer) and one GPU's
#           windows of CP_LEN / NGPU: losses step by step against the whole run (bf16 tolerance)
#           and time per token
#   zero    ZCFG (the Qwen2.5-3B shape at ZLEN tokens, layer recomputation) on NGPU GPUs with
#           train.zero = 0 and 1: peak memory per GPU, optimizer state per rank, step time
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh (stage `scaling`):
#   NGPU=8 STEPS=10 bash bench/gpu/gpu_scaling.sh        # tables on stdout and in $OUT/gpu_scaling.md
#   PARTS="weak strong" narrows the studies; CFG (default configs/gpu_longtail.toml), TPG (tokens per
#   GPU per step, default 4 micro-batches of CFG), DOCS, MAXLEN (the long-tail corpus), CP_LEN
#   (131072), ZCFG (configs/qwen2.5-3b.toml), ZLEN (32768) as named; LONG=split splits the corpus's
#   documents longer than a micro-batch in weak/strong instead of cutting them into windows
# Dry run on the CPU (real MPI ranks, a tiny model):
#   EXTRA="--set train.device=cpu --set model.n_layers=2 --set model.d_model=64 --set model.n_heads=1
#          --set model.n_kv_heads=1 --set model.ffn_dim=128 --set train.micro_batch_tokens=1024"
#   NGPU=2 DOCS=200 MAXLEN=1024 TPG=2048 CP_LEN=2048 ZLEN=1024 STEPS=3 bash bench/gpu/gpu_scaling.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SB=${SB:-build-gpu/src/sparsebalance}
PY=${PYTHON:-python3}  # 3.11+ (tomllib)
OUTDIR=${OUT:-gpu-out}
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
STEPS=${STEPS:-10}
PARTS=${PARTS:-"weak strong cp zero"}
CFG=${CFG:-$ROOT/configs/gpu_longtail.toml}
DOCS=${DOCS:-4000}
MAXLEN=${MAXLEN:-65536}
CP_LEN=${CP_LEN:-131072}
ZCFG=${ZCFG:-$ROOT/configs/qwen2.5-3b.toml}
ZLEN=${ZLEN:-32768}
LONG=${LONG:-window}  # weak/strong: documents longer than a micro-batch windowed, or split (split)
R=${RUNS:-runs/gpu_scaling}  # data, profile, metrics (relative to the working directory)
[ "$NGPU" -ge 1 ] 2>/dev/null || { echo "gpu_scaling: NGPU must be a GPU count >= 1 (got '$NGPU')"; exit 2; }
read -r -a EX <<< "${EXTRA:-}"
source "$ROOT/bench/gpu/gpu_mpi.sh"
MB=$(micro_batch_of "$CFG" "${EX[@]}") || { echo "gpu_scaling: cannot read train.micro_batch_tokens of $CFG"; exit 2; }
TPG=${TPG:-$((4 * MB))}
COUNTS=""; for ((n = 1; n <= NGPU; n *= 2)); do COUNTS="$COUNTS $n"; done
[ $((NGPU & (NGPU - 1))) = 0 ] || COUNTS="$COUNTS $NGPU"
mkdir -p "$OUTDIR" $R
log() { echo "== $(date -u +%H:%M:%S) $*"; }
echo "gpu_scaling: NGPU=$NGPU counts:$COUNTS tokens per GPU $TPG, steps $STEPS, parts: $PARTS" | tee "$OUTDIR/gpu_scaling_args.txt"

# name, ranks, config, flags...: one training run, its summary in $OUTDIR/scaling_NAME.json; the run's
# flags come after EXTRA's, so they win (the cp runs' micro-batches)
run() {
  local name=$1 np=$2 cfg=$3; shift 3
  local dir=$R/$name
  rm -rf "$dir"; mkdir -p "$dir"
  log "train $name ($np rank(s))"
  gpu_mpirun "$np" "$SB" train "$cfg" --set train.steps="$STEPS" "${EX[@]}" "$@" \
    --set checkpoint.dir="${CKPT:-$dir/ckpt}" --set log.path="$dir/metrics.h5" --summary "$OUTDIR/scaling_$name.json" \
    > "$OUTDIR/scaling_$name.log" 2>&1 || { echo "train $name failed:"; tail -20 "$OUTDIR/scaling_$name.log"; return 1; }
  rm -rf "$dir/ckpt"  # weights and moments: not wanted here
  grep -E "^(gpu memory|memory per rank|done)" "$OUTDIR/scaling_$name.log"
}
synth() {  # directory, prep synth flags...
  local d=$1; shift
  [ -f "$d/shard_00000.h5" ] || "$SB" prep synth "$@" --output "$d" > "$OUTDIR/prep_$(basename "$d").log" 2>&1 ||
    { cat "$OUTDIR/prep_$(basename "$d").log"; exit 1; }
}

case " $PARTS " in *" weak "*|*" strong "*)
  synth $R/data_longtail --preset longalign --docs "$DOCS" --seed 7 --max-len "$MAXLEN" --min-len 64
  D=(--set data.path=$R/data_longtail --set data.long_docs=$LONG)
  log "latency model on one GPU"
  gpu_mpirun 1 "$SB" profile "$CFG" "${D[@]}" "${EX[@]}" \
    --output $R/profile_1gpu.h5 > "$OUTDIR/scaling_profile.log" 2>&1 || { tail -20 "$OUTDIR/scaling_profile.log"; exit 1; }
  P=(--set balance.profile=$R/profile_1gpu.h5 --set balance.batching=sparse --set balance.tuning=dst)
  for n in $COUNTS; do
    case " $PARTS " in *" weak "*) run weak_$n "$n" "$CFG" "${D[@]}" "${P[@]}" --set train.global_batch_tokens=$((n * TPG)) ;; esac
    case " $PARTS " in *" strong "*) run strong_$n "$n" "$CFG" "${D[@]}" "${P[@]}" --set train.global_batch_tokens=$((NGPU * TPG)) ;; esac
  done ;;
esac

case " $PARTS " in *" cp "*)
  synth $R/data_cp --preset fixed --docs $((STEPS + 2)) --seed 11 --max-len "$CP_LEN" --min-len "$CP_LEN"
  C=(--set data.path=$R/data_cp --set data.val_fraction=0 --set train.global_batch_tokens=$CP_LEN
     --set balance.batching=sequential --set balance.tuning=fixed --set balance.self_profile=false)
  run cp_whole_1 1 "$CFG" "${C[@]}" --set train.micro_batch_tokens=$CP_LEN --set train.recompute=layer
  run cp_window_1 1 "$CFG" "${C[@]}" --set train.micro_batch_tokens=$((CP_LEN / NGPU)) --set data.long_docs=window
  for n in $COUNTS; do
    [ "$n" -ge 2 ] && run cp_part_$n "$n" "$CFG" "${C[@]}" --set train.micro_batch_tokens=$((CP_LEN / n)) \
      --set data.long_docs=split
  done ;;
esac

case " $PARTS " in *" zero "*)
  synth $R/data_zero --preset fixed --docs $((2 * NGPU * (STEPS + 2))) --seed 13 --max-len "$ZLEN" --min-len "$ZLEN"
  Z=(--set data.path=$R/data_zero --set data.val_fraction=0 --set train.micro_batch_tokens=$ZLEN
     --set train.global_batch_tokens=$((NGPU * ZLEN)) --set train.recompute=layer --set balance.self_profile=false)
  # the final checkpoint (37 GB for the 3B shape) is not wanted: a directory nothing can create
  # makes its write fail at once (checkpoint.on_error = continue), as bench/gpu/gpu_3b_memory.sh does
  for z in 0 1; do
    CKPT=/proc/sb-no-checkpoint run zero${z}_$NGPU "$NGPU" "$ZCFG" "${Z[@]}" --set train.zero=$z \
      --set checkpoint.on_error=continue
  done ;;
esac

"$PY" "$ROOT/bench/analysis/gpu_scaling_report.py" "$OUTDIR" "$NGPU" "$TPG" $COUNTS | tee "$OUTDIR/gpu_scaling.md"
