#!/usr/bin/env bash
# The chunked LM head (model.lm_head_chunk) and layer recomputation (train.recompute) on one GPU,
# side by side, after jobs/gpu/build_on_gpu.sh (SB = the binary it built). First the CUDA model
# tests of both (test_train_cuda, ModelCuda.*), then `train` of the 0.47B model (configs/gpu_0p5b.toml)
# and of a Qwen2.5-0.5B-shaped one (vocab 151,936, where the head is a large share) at each L, dense,
# in four variants: neither, chunk, recompute, both. Prints per run: median step ms (steps 3..),
# tokens/s, mfu and peak device memory as `train` reports them, first and last loss.
#   LENS="16384 32768" STEPS=6 CHUNK=4096 bash bench/gpu/lmhead_ab.sh      # table on stdout, CSV in $OUT
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
TEST=${TEST:-build-gpu/tests/cuda/test_train_cuda}
OUTDIR=${OUT:-gpu-out}
LENS=${LENS:-"16384"}
STEPS=${STEPS:-6}
CHUNK=${CHUNK:-4096}
WHOLE=1073741824  # a chunk of at least the micro-batch: the whole logits (0 would pick a chunk)
mkdir -p "$OUTDIR" runs/lmhead_ab
if [ -x "$TEST" ]; then
  "$TEST" --gtest_filter='ModelCuda.*' > "$OUTDIR/lmhead_tests.log" 2>&1; echo "test_train_cuda ModelCuda.*: rc $?"
  grep -E "^\[  (FAILED|PASSED) |lm_head_chunk=|worst" "$OUTDIR/lmhead_tests.log"
fi
CSV=$OUTDIR/lmhead_ab.csv
echo "model,L,variant,step_ms,tokens_per_s,mfu,peak_mem_gib,first_loss,last_loss" > "$CSV"
QWEN=(--set model.d_model=896 --set model.n_layers=24 --set model.n_heads=14 --set model.n_kv_heads=2
      --set model.ffn_dim=4864 --set model.vocab_size=151936)
for L in $LENS; do
  data=runs/lmhead_ab/data_$L
  [ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
      --output "$data" > /dev/null || exit 1
  for model in 0p5b qwen; do
    shape=(); [ $model = qwen ] && shape=("${QWEN[@]}")
    for variant in none chunk recompute both; do
      ex=(--set model.lm_head_chunk=$WHOLE --set train.recompute=none)
      case $variant in
        chunk) ex=(--set model.lm_head_chunk="$CHUNK" --set train.recompute=none) ;;
        recompute) ex=(--set model.lm_head_chunk=$WHOLE --set train.recompute=layer) ;;
        both) ex=(--set model.lm_head_chunk="$CHUNK" --set train.recompute=layer) ;;
      esac
      tag=${model}_${L}_$variant
      rm -rf runs/lmhead_ab/ckpt_$tag
      "$SB" train configs/gpu_0p5b.toml "${shape[@]}" "${ex[@]}" --set data.path="$data" --set data.val_fraction=0 \
        --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set train.steps="$STEPS" \
        --set attention.mode=dense --set balance.tuning=fixed --set balance.self_profile=false \
        --set checkpoint.dir=runs/lmhead_ab/ckpt_$tag --set log.path=runs/lmhead_ab/metrics_$tag.h5 \
        --summary runs/lmhead_ab/$tag.json > "$OUTDIR/lmhead_$tag.log" 2>&1 \
        || { echo "train failed ($tag):"; tail -5 "$OUTDIR/lmhead_$tag.log"; echo "$model,$L,$variant,failed,,,,," >> "$CSV"; continue; }
      rm -rf runs/lmhead_ab/ckpt_$tag
      python3 - runs/lmhead_ab/$tag.json "$model" "$L" "$variant" >> "$CSV" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1]))
ms = statistics.median(s["step_ms"][2:] or s["step_ms"])
print(f"{sys.argv[2]},{sys.argv[3]},{sys.argv[4]},{ms:.1f},{2 * int(sys.argv[3]) / (ms / 1e3):.0f},{s['mfu']:.4f},"
      f"{s['peak_mem_gib']:.2f},{s['first_loss']:.4f},{s['last_loss']:.4f}")
PY
    done
  done
done
python3 -c "import csv, sys; [print('  '.join(f'{c:<12}' for c in r)) for r in csv.reader(open(sys.argv[1]))]" "$CSV"
