#!/usr/bin/env bash
# End-to-end training throughput on one GPU: `sparsebalance train configs/gpu_0p5b.toml` (0.47B
# parameters) dense and sparse at each context length, beside the same model in PyTorch
# (bench/torch/torch_model_ref.py: cuDNN for dense, FlexAttention for sparse at the density our gating
# kept). Run on the GPU machine after jobs/gpu/build_on_gpu.sh (SB = the binary it built).
#   LENS="16384 32768" STEPS=8 bash bench/gpu/gpu_e2e.sh        # table on stdout, CSV in $OUT
#   CONFIG=configs/qwen2.5-0.5b.toml NAME=qwen LENS=16384 bash bench/gpu/gpu_e2e.sh   # another shape
#   RECOMPUTE=1 LENS=131072 MODES=dense bash bench/gpu/gpu_e2e.sh  # train.recompute = layer beside
#     --checkpoint-layers in PyTorch (the 128K row); MODES narrows dense/sparse
#   TORCH_STEPS=2 TORCH_WARMUP=1: PyTorch's timed and warm-up steps (default 6 and 3)
#   CONFIG=configs/qwen2.5-0.5b.toml NAME=qwen_b128 BLOCK=128 K=8 bash bench/gpu/gpu_e2e.sh
#     BLOCK (both sides' attention block) and K (our attention.k) override CONFIG's [attention]
#     (the wgmma kernels take blocks of 128 only: kernels/cuda/attention_fwd_sm90.cu)
#   CONFIG=configs/qwen3-0.6b.toml NAME=qwen3 LENS=16384 bash bench/gpu/gpu_e2e.sh    # Qwen3-0.6B:
#     head_dim 128 beside 1024 / 16 heads, q/k norms (both sides)
#   CONFIG=configs/llama3.2-1b.toml NAME=llama32 LENS=16384 bash bench/gpu/gpu_e2e.sh  # Llama 3.2 1B
#     (its llama3 RoPE scaling changes no cost: PyTorch's side runs plain RoPE)
#   GATE_QUERY=max GATE_KEY=bounds DENSE_LAYERS=last:2 NAME=0p5b_qmax_kb bash bench/gpu/gpu_e2e.sh: another
#     gate mode and hybrid layers (kernels/README.md, "Gate modes"; as gpu_phase_breakdown.sh); the attention
#     column names them (sparse:max/bounds+last:2); PyTorch's row runs FlexAttention at the kept fraction
#     our run reported over all layers (dense layers count 1), so both sides attend the same pairs
#   SUMMARY=runs/ft_qwen3-0.6b/ft.json CONFIG=configs/qwen3-0.6b.toml NAME=qwen3-0.6b LENS=16384 MODES=sparse
#     bash bench/gpu/gpu_e2e.sh: our row from that run's --summary instead of a new run (one L, one
#     mode; a run of this layout, 2 documents of L tokens a step: bench/torch/hf_finetune.sh's), PyTorch's run
# CONFIG's [model] gives both sides their shape, head_dim and qk_norm included (torch_model_ref.py has
# no q/k/v biases: the Qwen2.5 row's PyTorch side is a little cheaper). Peak GPU memory of each run in
# the last column.
# tokens/s: our steps 3.. (the first two include cuBLAS/allocator warm-up), median step time.
# MFU: the formula torch_model_ref.py prints (6 * N_lin + 3 * 4 * L * H * D * attended pairs per
# token) over 989 TFLOP/s (H200 dense bf16); attended pairs for our sparse runs = dense pairs x the
# kept fraction of causal blocks that gating reports.
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
LENS=${LENS:-"16384 32768"}
STEPS=${STEPS:-8}
TORCH=${TORCH:-1}
CONFIG=${CONFIG:-configs/gpu_0p5b.toml}
NAME=${NAME:-0p5b}
MODES=${MODES:-"dense sparse"}
RECOMPUTE=${RECOMPUTE:-0}
TORCH_STEPS=${TORCH_STEPS:-6}    # PyTorch timed steps and warm-up steps (fewer for 128K)
TORCH_WARMUP=${TORCH_WARMUP:-3}
mkdir -p "$OUTDIR" runs/gpu_e2e
[ -n "${SUMMARY:-}" ] && [ "$(echo $LENS $MODES | wc -w)" != 2 ] && { echo "SUMMARY=$SUMMARY takes one L (LENS) and one mode (MODES)"; exit 2; }
CSV=$OUTDIR/gpu_e2e.csv
[ -f "$CSV" ] || echo "impl,model,L,attention,recompute,density,step_ms,tokens_per_s,mfu,first_loss,last_loss,peak_gib" > "$CSV"
# The shape from CONFIG's [model], for PyTorch's arguments and the one MFU formula of both rows.
read -r NL C H HKV F V TIED BLK HD QKN < <(python3 - "$CONFIG" <<'PY'
import sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb")); m = c["model"]; a = c.get("attention", {})
print(m["n_layers"], m["d_model"], m["n_heads"], m["n_kv_heads"], m["ffn_dim"], m["vocab_size"],
      int(m.get("tie_embeddings", True)), a.get("block_size", 128), m.get("head_dim", 0) or m["d_model"] // m["n_heads"],
      int(m.get("qk_norm", False)))
PY
) || { echo "cannot read [model] of $CONFIG"; exit 1; }
BLK=${BLOCK:-$BLK}
shape=(--layers "$NL" --d-model "$C" --heads "$H" --kv-heads "$HKV" --head-dim "$HD" --ffn "$F" --vocab "$V" --block "$BLK")
[ "$TIED" = 1 ] || shape+=(--untied)
[ "$QKN" = 1 ] && shape+=(--qk-norm)
att_sets=()
[ -n "${BLOCK:-}" ] && att_sets+=(--set attention.block_size="$BLOCK")
[ -n "${K:-}" ] && att_sets+=(--set attention.k="$K")
gate=""  # the attention column's suffix: the gate mode and dense layers when not the config's
[ -n "${GATE_QUERY:-}" ] && { att_sets+=(--set attention.gate_query="$GATE_QUERY"); gate=$GATE_QUERY; }
[ -n "${GATE_KEY:-}" ] && { att_sets+=(--set attention.gate_key="$GATE_KEY"); gate=${gate:-mean}/$GATE_KEY; }
[ -n "${GATE_SUB:-}" ] && { att_sets+=(--set attention.gate_sub_blocks="$GATE_SUB"); gate=$gate,sub$GATE_SUB; }
[ -n "${DENSE_LAYERS:-}" ] && { att_sets+=(--set attention.dense_layers="$DENSE_LAYERS"); gate=$gate+$DENSE_LAYERS; }
rc_sets=(); rc_torch=(); rc_name=none
[ "$RECOMPUTE" = 1 ] && { rc_sets=(--set train.recompute=layer); rc_torch=(--checkpoint-layers); rc_name=layer; }
for L in $LENS; do
  data=runs/gpu_e2e/data_$L
  [ -n "${SUMMARY:-}" ] || [ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
      --output "$data" > /dev/null || exit 1
  for mode in $MODES; do
    # dense runs fixed budgets: no latency model to fit, so no self-profile (~40-60 s a run at 64K+)
    tuning=fixed; prof=false; [ $mode = sparse ] && { tuning=dst; prof=true; }
    tag=${NAME}_${L}_${mode}_$rc_name
    sum=runs/gpu_e2e/sb_$tag.json
    rm -rf runs/gpu_e2e/ckpt_$tag
    if [ -n "${SUMMARY:-}" ]; then
      sum=$SUMMARY  # our row from that run
    elif ! "$SB" train "$CONFIG" --set data.path="$data" --set data.val_fraction=0 "${rc_sets[@]}" "${att_sets[@]}" \
        --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set train.steps="$STEPS" \
        --set attention.mode=$mode --set balance.tuning=$tuning --set balance.self_profile=$prof --set checkpoint.dir=runs/gpu_e2e/ckpt_$tag \
        --set log.path=runs/gpu_e2e/metrics_$tag.h5 --summary "$sum" > "$OUTDIR/sb_$tag.log" 2>&1; then
      echo "sparsebalance train failed ($tag):"; tail -20 "$OUTDIR/sb_$tag.log"; continue
    fi
    att=$mode; [ $mode = sparse ] && [ -n "$gate" ] && att=sparse:$gate
    python3 - "$sum" "$L" "$att" "$NAME" "$rc_name" $NL $C $H $HKV $F $V $HD $QKN >> "$CSV" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1])); L = int(sys.argv[2]); mode = sys.argv[3]; name, rc = sys.argv[4:6]
Lyr, C, H, Hkv, F, V, D, qkn = map(int, sys.argv[6:14])
# tied or not, the LM head's V x C matmul is computed: it counts either way (q/k norms: 2 x D weights)
n_lin = Lyr * (2 * C + 2 * D * qkn + C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * F) + C + V * C
ms = statistics.median(s["step_ms"][2:] or s["step_ms"])
tok = 2 * L  # two micro-batches of one L-token document per step
dens = s["mean_density"] if mode.startswith("sparse") else 1.0
pairs_per_token = dens * (L + 1) / 2
fpt = 6 * n_lin + 3 * 4 * Lyr * H * D * pairs_per_token
tps = tok / (ms / 1e3)
print(f"sparsebalance,{name},{L},{mode},{rc},{dens:.4f},{ms:.1f},{tps:.0f},{fpt * tps / 989e12:.4f},"
      f"{s['first_loss']:.4f},{s['last_loss']:.4f},{s.get('peak_mem_gib', 0):.2f}")
PY
    rm -rf runs/gpu_e2e/ckpt_$tag  # 5.6 GB each (weights and moments)
    if [ "$TORCH" = 1 ]; then
      dens=$(tail -1 "$CSV" | cut -d, -f6)
      targs=(--attention dense)
      [ $mode = sparse ] && targs=(--attention sparse --density "$dens")
      rm -f "$OUTDIR/torch_$tag.csv"
      timeout 300 python3 bench/torch/torch_model_ref.py --seq "$L" "${targs[@]}" "${shape[@]}" "${rc_torch[@]}" --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" \
        --csv "$OUTDIR/torch_$tag.csv" > "$OUTDIR/torch_$tag.log" 2>&1 || { echo "torch ref failed ($tag)"; tail -5 "$OUTDIR/torch_$tag.log"; }
      [ -f "$OUTDIR/torch_$tag.csv" ] && python3 - "$OUTDIR/torch_$tag.csv" "$NAME" "$rc_name" >> "$CSV" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
if rows:
    r = rows[-1]
    print(f"pytorch,{sys.argv[2]},{r['seq']},{r['attention']},{sys.argv[3]},{r.get('kept_frac') or 1},{r['step_ms_median']},"
          f"{float(r['tokens_per_s']) if r['tokens_per_s'] else 0:.0f},{r['mfu']},{r['loss_first']},{r['loss_last']},"
          f"{r.get('peak_mem_gib', '')}")
PY
    fi
  done
done
python3 - "$CSV" <<'PY'
import csv, sys
r = list(csv.reader(open(sys.argv[1])))
w = [max(len(x[i]) for x in r) for i in range(len(r[0]))]
for x in r:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(x)))
PY
