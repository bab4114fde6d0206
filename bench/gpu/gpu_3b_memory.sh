#!/usr/bin/env bash
# The Qwen2.5-3B shape (configs/qwen2.5-3b.toml: 36 layers, d_model 2048, 16/2 heads, ffn 11008,
# vocab 151,936, tied, q/k/v biases; random weights) training a few steps of one 32K-token document on
# one GPU, train.zero = 0 and 1 at one rank: peak GPU memory, tokens/s and what each rank holds for
# the parameters and the optimizer (the "gpu memory per rank" line). Layer recomputation and the
# chunked LM head keep the activations small. Run on the GPU machine after jobs/gpu/build_on_gpu.sh
# (SB = the binary it built), or as its stage `memory3b`:
#   STEPS=4 L=32768 bash bench/gpu/gpu_3b_memory.sh        # table on stdout, CSV and logs in $OUT
# At one rank ZeRO-1 holds the whole slice (the same optimizer state; the model keeps fp32 copies
# only of the embedding, norms and biases instead of a whole fp32 master): its optimizer state per
# rank falls as 1/ranks with more ranks, which the printed line states.
# The final checkpoint (37 GB of weights and moments) is not wanted here: checkpoint.dir is a path
# nothing can create, so the write fails at once and training ends (checkpoint.on_error = continue).
# tokens/s: the median of steps 2.. (the first includes cuBLAS/allocator warm-up).
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
STEPS=${STEPS:-4}
L=${L:-32768}
ZEROS=${ZEROS:-"0 1"}
mkdir -p "$OUTDIR" runs/gpu_3b
data=runs/gpu_3b/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 8 --max-len "$L" --min-len "$L" \
    --output "$data" > /dev/null || exit 1
CSV=$OUTDIR/gpu_3b_memory.csv
echo "zero,L,steps,peak_gib,step_ms,tokens_per_s,optimizer_mib,first_loss,last_loss" > "$CSV"
for z in $ZEROS; do
  sum=runs/gpu_3b/summary_zero$z.json
  log=$OUTDIR/gpu_3b_zero$z.log
  rm -f "$sum" runs/gpu_3b/metrics_zero$z.h5
  timeout 260 "$SB" train configs/qwen2.5-3b.toml --set data.path="$data" --set data.val_fraction=0 \
    --set train.micro_batch_tokens="$L" --set train.global_batch_tokens="$L" --set train.steps="$STEPS" \
    --set train.warmup_steps=1 --set train.recompute=layer --set model.lm_head_chunk=4096 --set train.zero="$z" \
    --set balance.self_profile=false --set balance.tuning=fixed --set log.progress=false --set log.every=1 \
    --set train.sync_check_every=0 --set checkpoint.dir=/proc/sb-no-checkpoint --set checkpoint.on_error=continue \
    --set log.path=runs/gpu_3b/metrics_zero$z.h5 --summary "$sum" > "$log" 2>&1 \
    || { echo "sparsebalance train failed (zero=$z):"; tail -20 "$log"; continue; }
  grep -E "^(memory per rank|gpu memory per rank)" "$log" | tail -2
  opt=$(grep "^gpu memory per rank" "$log" | tail -1 | sed -E 's/.*optimizer state ([0-9.]+) MiB.*/\1/')
  python3 - "$sum" "$z" "$L" "${opt:-0}" >> "$CSV" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1])); z, L, opt = sys.argv[2], int(sys.argv[3]), sys.argv[4]
ms = statistics.median(s["step_ms"][1:] or s["step_ms"])
print(f"{z},{L},{s['steps']},{s['peak_mem_gib']:.2f},{ms:.0f},{L / (ms / 1e3):.0f},{opt},{s['first_loss']:.4f},{s['last_loss']:.4f}")
PY
done
column -s, -t < "$CSV"
