#!/usr/bin/env bash
# LoRA against peft (issue 52) on the GPU machine, after jobs/gpu/build_on_gpu.sh. Our LoRA runs on
# DEVICE (default cuda: bf16 base and GEMMs, peft under bf16 autocast beside it; DEVICE=cpu: our
# fp32 CPU engine, peft in fp32):
#   CONFIG=configs/qwen2.5-0.5b.toml L=1024 STEPS=10 bash bench/torch/lora_peft_check.sh
# 1. data: 24 synthetic documents of L tokens (vocab 259 ids, inside any vocabulary), 2 per step;
# 2. a random base of CONFIG's shape: one full step at lr 1e-12 (the init, bit for bit), exported
#    as an f32 HF directory;
# 3. LoRA (rank 8, alpha 16, every target; train_also "norm": a tied model's embedding would be two
#    untied copies under peft's modules_to_save) trained PRE steps so B is not zero, exported as a
#    PEFT adapter (f32);
# 4. STEPS LoRA steps --init-from that adapter, every step's documents in log.batches;
# 5. bench/torch/torch_trajectory.py --adapter [--fp32 with DEVICE=cpu]: (a) peft's loss of step 1's documents on the
#    base + our adapter against our step-1 loss, (b) the STEPS in a plain PyTorch + peft AdamW loop.
# Output in $OUT: lora_traj.log, lora_traj.json.
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
CONFIG=${CONFIG:-configs/qwen2.5-0.5b.toml}
L=${L:-1024}
STEPS=${STEPS:-10}
DEVICE=${DEVICE:-cuda}
fp32=(); [ "$DEVICE" = cpu ] && fp32=(--fp32)
PRE=${PRE:-3}
R=${RUNS:-runs}/lora_peft
mkdir -p "$OUTDIR" $R
data=$R/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
  --output "$data" > /dev/null || exit 1
sets=(--set train.device="$DEVICE" --set data.path="$data" --set data.val_fraction=0 --set train.micro_batch_tokens="$L"
      --set train.global_batch_tokens=$((2 * L)) --set attention.mode=dense --set balance.tuning=fixed
      --set balance.self_profile=false --set checkpoint.every=0 --set log.every=1 --set train.warmup_steps=2)
lora=(--set lora.rank=8 --set lora.alpha=16 --set lora.train_also=norm)
run() { local log=$1; shift; "$SB" train "$CONFIG" "${sets[@]}" "$@" > "$OUTDIR/$log" 2>&1 || { tail -20 "$OUTDIR/$log"; exit 1; }; }
rm -rf $R/ck* $R/base_hf $R/adapter
run lora_base.log --set train.steps=1 --set train.lr=1e-12 --set checkpoint.dir=$R/ck0 --set log.path=$R/m0.h5
"$SB" convert $R/ck0/ckpt_00000001.h5 $R/base_hf --dtype f32 || exit 1
run lora_pre.log --init-from $R/base_hf "${lora[@]}" --set train.steps="$PRE" --set train.lr=1e-3 \
  --set checkpoint.dir=$R/ck1 --set log.path=$R/m1.h5
"$SB" convert "$(ls $R/ck1/ckpt_*.h5 | tail -1)" $R/adapter || exit 1   # f32 PEFT adapter
run lora_ours.log --init-from $R/adapter "${lora[@]}" --set train.steps="$STEPS" --set train.lr=1e-3 \
  --set checkpoint.dir=$R/ck --set log.path=$R/m.h5 --set log.batches=$R/batches.jsonl
PYTHONUNBUFFERED=1 python3 bench/torch/torch_trajectory.py --hf $R/base_hf --adapter $R/adapter "${fp32[@]}" \
  --batches $R/batches.jsonl --metrics $R/m.h5 --checkpoint "$(ls $R/ck/ckpt_*.h5 | tail -1)" --steps "$STEPS" \
  --json "$OUTDIR/lora_traj.json" 2>&1 | tee "$OUTDIR/lora_traj.log"
