#!/usr/bin/env bash
# A published model shape converted, fine-tuned, exported and reloaded by transformers (issues 19,
# 51), on the GPU machine after jobs/gpu/build_on_gpu.sh:
#   MODEL=qwen3-0.6b L=16384 STEPS=50 RUNS=/dev/shm bash bench/torch/hf_finetune.sh
#   MODEL = qwen2.5-0.5b (default) | qwen3-0.6b | llama3.2-1b; configs/$MODEL.toml is the recipe
#   TINY=1 MODEL=llama3.2-1b bash bench/torch/hf_finetune.sh   # toy dims on the CPU (below)
# 1. bench/torch/hf_random_model.py: a random model of MODEL's published config.json (transformers'
#    from_config, bf16, random norms and biases): no weights can be fetched there;
# 2. `train configs/$MODEL.toml --init-from` that directory (the import of `convert`, in memory;
#    CONVERT_IN=1 writes it as a checkpoint with `convert` first and starts from that) for STEPS steps
#    of 2 documents of L tokens (PRESET=fixed: the data layout of bench/gpu/gpu_e2e.sh; PRESET=longalign:
#    lengths up to L) with sparse attention and DST, then `convert` the last checkpoint back (bf16);
# 3. the reload: our dense loss of a batch at the exported weights (`train --init-from` the export,
#    one step at lr 1e-12, log.batches; train.zero = 1 only for its streamed checkpoint writer, 2-3x
#    faster than the whole-file one) and transformers' on the same documents
#    (bench/torch/torch_trajectory.py --steps 0: AutoModelForCausalLM, so Qwen3's q/k norms and
#    Llama 3's RoPE scaling are transformers' own);
# 4. E2E=1 (default; PRESET=fixed only): the fine-tune's tokens/s (median of steps 3..STEPS) as a
#    bench/gpu/gpu_e2e.sh row (SUMMARY=) beside PyTorch + FlexAttention at the density our gating kept
#    (bench/torch/torch_model_ref.py with configs/$MODEL.toml's shape; TORCH_STEPS, TORCH_WARMUP). It
#    starts when the fine-tune ends: its compilation (CPU, ~1 min) runs beside our export (CPU only),
#    and the check run (GPU) waits for it, so no two GPU jobs overlap.
# Output in $OUT: ft_${MODEL}_{train,check,reload,e2e}.log, ft_${MODEL}_{summary,reload}.json, one
# row a run in hf_finetune.csv (losses, tokens/s, the reload's losses, seconds per part), gpu_e2e.csv.
# RUNS=/dev/shm keeps the checkpoints (12 bytes a parameter: 15 GB at 1.2B) in memory: writing them
# to that machine's disk took half a minute each at 0.5B. Each is removed once read.
# TINY=1: hf_random_model.py --tiny (2 layers, d_model 64, vocab 320), L=512 (else 16384),
# train.device=cpu, block 64 and k 2 (sparse at that length), E2E=0 unless given; transformers' reload
# only where torch has a GPU. PY names the Python with numpy (the CPU machine: PY=/usr/bin/python3).
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
MODEL=${MODEL:-qwen2.5-0.5b}
TINY=${TINY:-0}
L=${L:-$([ "$TINY" = 1 ] && echo 512 || echo 16384)}
STEPS=${STEPS:-50}
PRESET=${PRESET:-fixed}
CONVERT_IN=${CONVERT_IN:-0}
E2E=${E2E:-$([ "$TINY" = 1 ] && echo 0 || echo 1)}
PY=${PY:-python3}
CONFIG=configs/$MODEL.toml
[ -f "$CONFIG" ] || { echo "MODEL=$MODEL: no $CONFIG (qwen2.5-0.5b, qwen3-0.6b, llama3.2-1b)"; exit 2; }
R=${RUNS:-runs}/ft_$MODEL
mkdir -p "$OUTDIR" "$R"
rm -rf "$R/hf" "$R/ck" "$R/out_hf" "$R/ck_check" "$R/ck0.h5"
tag=ft_$MODEL
sets=(--set data.val_fraction=0 --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)))
tiny=()
if [ "$TINY" = 1 ]; then
  tiny=(--tiny)
  sets+=(--set train.device=cpu --set attention.block_size=64 --set attention.k=2)
fi
now() { date +%s.%N; }
secs() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$@"; }
t0=$(now)
PYTHONUNBUFFERED=1 "$PY" bench/torch/hf_random_model.py "$MODEL" "$R/hf" "${tiny[@]}" || exit 1
t_make=$(secs "$t0" "$(now)")
# The model's RoPE: a config file that sets model.rope_scaling.* keys runs its own scaling over
# --init-from's (io/SAFETENSORS.md); configs/llama3.2-1b.toml's is the published one, the tiny's
# original context is 64.
if [ "$TINY" = 1 ]; then
  orig=$("$PY" -c "import json, sys; c = json.load(open(sys.argv[1])); \
print((c.get('rope_parameters') or c.get('rope_scaling') or {}).get('original_max_position_embeddings', ''))" "$R/hf/config.json")
  [ -n "$orig" ] && sets+=(--set model.rope_scaling.original_max_position_embeddings="$orig")
fi
data=$R/data_${PRESET}_$L
if [ ! -f "$data/shard_00000.h5" ]; then
  if [ "$PRESET" = fixed ]; then  # every document seen once: STEPS x 2 of L tokens
    "$SB" prep synth --preset fixed --docs $((2 * STEPS)) --max-len "$L" --min-len "$L" --output "$data" > /dev/null || exit 1
  else
    "$SB" prep synth --preset "$PRESET" --docs 400 --max-len "$L" --output "$data" > /dev/null || exit 1
  fi
fi
init=$R/hf
t1=$(now)
if [ "$CONVERT_IN" = 1 ]; then
  "$SB" convert "$R/hf" "$R/ck0.h5" --overwrite || exit 1
  init=$R/ck0.h5
fi
t_in=$(secs "$t1" "$(now)")
t1=$(now)
"$SB" train "$CONFIG" --init-from "$init" --set data.path="$data" "${sets[@]}" --set train.steps="$STEPS" \
  --set checkpoint.dir="$R/ck" --set checkpoint.every=0 --set log.path="$R/m.h5" --summary "$R/ft.json" \
  > "$OUTDIR/${tag}_train.log" 2>&1 || { tail -30 "$OUTDIR/${tag}_train.log"; exit 1; }
t_train=$(secs "$t1" "$(now)")
rm -f "$R/ck0.h5"
cp "$R/ft.json" "$OUTDIR/${tag}_summary.json"
e2e_pid=
trap wait EXIT  # an early exit still waits for PyTorch's row: never two GPU jobs at once
if [ "$E2E" = 1 ] && [ "$PRESET" = fixed ]; then
  SB=$SB OUT=$OUTDIR CONFIG=$CONFIG NAME=$MODEL LENS=$L MODES=sparse SUMMARY=$OUTDIR/${tag}_summary.json \
    TORCH_STEPS=${TORCH_STEPS:-4} TORCH_WARMUP=${TORCH_WARMUP:-2} bash bench/gpu/gpu_e2e.sh > "$OUTDIR/${tag}_e2e.log" 2>&1 &
  e2e_pid=$!
fi
grep -E "init-from|latency model|train:" "$OUTDIR/${tag}_train.log" | head -4
tail -3 "$OUTDIR/${tag}_train.log"
last=$(ls "$R"/ck/ckpt_*.h5 | tail -1)
t1=$(now)
"$SB" convert "$last" "$R/out_hf" || exit 1
t_out=$(secs "$t1" "$(now)")
same=yes
"$PY" bench/torch/hf_random_model.py --compare "$R/hf" "$R/out_hf" || same=no
rm -rf "$R/ck"
if [ -n "$e2e_pid" ]; then
  wait "$e2e_pid" || echo "gpu_e2e.sh: rc $?"
  tail -4 "$OUTDIR/${tag}_e2e.log"
fi
t1=$(now)
"$SB" train "$CONFIG" --init-from "$R/out_hf" --set data.path="$data" "${sets[@]}" --set train.steps=1 \
  --set train.lr=1e-12 --set attention.mode=dense --set balance.tuning=fixed --set balance.self_profile=false \
  --set train.zero=1 --set checkpoint.dir="$R/ck_check" --set log.path="$R/m_check.h5" --set log.batches="$R/check.jsonl" \
  > "$OUTDIR/${tag}_check.log" 2>&1 || { tail -20 "$OUTDIR/${tag}_check.log"; exit 1; }
t_check=$(secs "$t1" "$(now)")
t1=$(now)
rm -f "$OUTDIR/${tag}_reload.json"
if "$PY" -c "import torch, transformers; assert torch.cuda.is_available()" 2> /dev/null; then
  PYTHONUNBUFFERED=1 "$PY" bench/torch/torch_trajectory.py --hf "$R/out_hf" --batches "$R/check.jsonl" --metrics "$R/m_check.h5" \
    --checkpoint "$(ls "$R"/ck_check/ckpt_*.h5 | tail -1)" --steps 0 --json "$OUTDIR/${tag}_reload.json" 2>&1 \
    | tee "$OUTDIR/${tag}_reload.log"
else
  echo "transformers' reload skipped: no torch with a GPU here (our side ran: $OUTDIR/${tag}_check.log)"
fi
t_reload=$(secs "$t1" "$(now)")
rm -rf "$R/ck_check"
CSV=$OUTDIR/hf_finetune.csv
[ -f "$CSV" ] || echo "model,params,L,steps,preset,first_loss,last_loss,tokens_per_s,step_ms_median,density,peak_gib,reload_ours,reload_torch_fp32,rel_fp32,reload_torch_bf16,rel_bf16,export_same,s_make,s_convert_in,s_train,s_convert_out,s_check,s_reload" > "$CSV"
"$PY" - "$R/ft.json" "$OUTDIR/${tag}_reload.json" "$R/m_check.h5" "$MODEL" "$L" "$PRESET" \
  "$same" "$t_make" "$t_in" "$t_train" "$t_out" "$t_check" "$t_reload" "$OUTDIR/${tag}_train.log" >> "$CSV" <<'PY'
import json, os, re, statistics, sys
s = json.load(open(sys.argv[1]))
rl = json.load(open(sys.argv[2]))["dense_loss"] if os.path.exists(sys.argv[2]) else {}
ours = rl.get("ours", "")
if not rl:  # no transformers here: our step-1 loss of the check run (read from its metrics log)
    try:
        import h5py
        with h5py.File(sys.argv[3], "r") as f:
            ours = float(f["steps"][0]["loss"])
    except Exception:  # noqa: BLE001  (no h5py: leave it empty)
        pass
params = re.search(r"model: ([0-9]+) parameters", open(sys.argv[14]).read())
ms = statistics.median(s["step_ms"][2:] or s["step_ms"])
rel = lambda k: f"{abs(rl[k] - rl['ours']) / rl['ours']:.1e}" if k in rl else ""
print(",".join(str(x) for x in [sys.argv[4], params.group(1) if params else "", sys.argv[5], s["steps"], sys.argv[6],
      f"{s['first_loss']:.4f}", f"{s['last_loss']:.4f}", f"{s['tokens_per_s']:.0f}", f"{ms:.1f}", f"{s['mean_density']:.4f}",
      f"{s.get('peak_mem_gib', 0):.2f}", f"{ours:.6f}" if ours != "" else "", f"{rl['torch_fp32']:.6f}" if rl else "", rel("torch_fp32"),
      f"{rl['torch_bf16']:.6f}" if rl else "", rel("torch_bf16")] + sys.argv[7:14]))
PY
tail -1 "$CSV"
rm -rf "$R/hf" "$R/out_hf"
