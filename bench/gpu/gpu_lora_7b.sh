#!/usr/bin/env bash
# Issue 52's 7B must-show: the Qwen2.5-7B shape (configs/qwen2.5-7b.toml, random weights) with LoRA r 16
# on every projection, layer recomputation, one GPU, at 64K and 32K tokens, dense and sparse: our
# `sparsebalance train` beside PyTorch + peft (bench/torch/torch_lora_ref.py: cuDNN SDPA dense,
# FlexAttention at the kept fraction our gating reported), and the plan of `sparsebalance memory` for
# the same settings against the measured peak. Run on the GPU machine after jobs/gpu/build_on_gpu.sh
# (SB = the binary it built), or as its stage `lora7b`:
#   bash bench/gpu/gpu_lora_7b.sh                     # table on stdout; CSV and logs in $OUT
#   LENS=65536 MODES=sparse TORCH=0 bash bench/gpu/gpu_lora_7b.sh   # one row of ours
#   TINY=1 bash bench/gpu/gpu_lora_7b.sh              # the flow on configs/tiny.toml on the CPU (no PyTorch)
# Resumable: rows go to runs/lora7b/lora7b.csv as they finish and a row already there is not run
# again (rm the CSV to start over); nothing new starts after DEADLINE (epoch seconds, default now +
# 540) and each run is cut at it, so one device call returns the rows it finished.
# tokens/s: our steps 2.. (the first includes cuBLAS/allocator warm-up), median; PyTorch: the median of
# TORCH_STEPS after TORCH_WARMUP (compilation). Peak memory: ours the summary's peak_mem_gib, PyTorch
# torch.cuda.max_memory_allocated (weights included).
# MFU, one formula for both rows: a LoRA step computes no weight gradient of the frozen base, so
# FLOPs/token = 4 N_lin (forward + input gradient) + 6 N_adapter + 3 * 4 * layers * H * D * pairs/token
# (pairs = kept fraction x (L+1)/2), over 989 TFLOP/s (H100/H200 dense bf16); recomputation's second
# forward is not counted (model FLOPs, not hardware FLOPs).
# Time (estimates, H100): each of our runs spends most of its time before the first step, in the
# host's random init of the 7.6B-parameter base (Model::init: one sequential Box-Muller stream,
# ~20-45 ns a value: ~150-350 s), then ~5-15 s a step; a PyTorch run ~60-90 s of compilation then
# 2-16 s a step. A whole table is ~20 min: 2-3 calls on a warm machine (the rows resume). 64K runs first
# (the headline), sparse before dense.
# Plan vs measured: the `sparsebalance memory` row "LoRA r 16, train.zero = 0" (its total: the base,
# the adapters' state, the buffers the CUDA model sizes for one L-token micro-batch and the block lists,
# plus 1.2 GiB for the CUDA runtime; src/model/README.md "Planning memory"); the must-show is within 10%.
# The run's last memory line (printed below) gives its activation buffers and the peak beyond its sums.
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
TINY=${TINY:-0}
CONFIG=${CONFIG:-configs/qwen2.5-7b.toml}
LENS=${LENS:-"65536 32768"}
MODES=${MODES:-"sparse dense"}
STEPS=${STEPS:-4}
TORCH=${TORCH:-1}
TORCH_STEPS=${TORCH_STEPS:-3}
TORCH_WARMUP=${TORCH_WARMUP:-1}
DEADLINE=${DEADLINE:-$(($(date +%s) + 540))}
# a run is not started with less time left than it needs (ours: the base's init alone takes minutes)
MIN_SB_S=${MIN_SB_S:-240}
MIN_TORCH_S=${MIN_TORCH_S:-120}
extra=()
if [ "$TINY" = 1 ]; then  # the same flow at CPU scale: tiny model, LoRA on, 2 short documents
  CONFIG=configs/tiny.toml; LENS=${TINY_LENS:-512}; TORCH=0; STEPS=3; MIN_SB_S=5
  extra=(--set train.device=cpu --set lora.rank=4 --set lora.alpha=8 --set attention.block_size=64 --set attention.k=2 --set model.vocab_size=0)
fi
W=runs/lora7b; [ "$TINY" = 1 ] && W=runs/lora7b_tiny
mkdir -p "$OUTDIR" "$W"
CSV=$W/lora7b.csv
[ -f "$CSV" ] || echo "impl,L,attention,density,step_ms,tokens_per_s,mfu,peak_gib,plan_gib,measured_over_plan,first_loss,last_loss" > "$CSV"
left() { echo $((DEADLINE - $(date +%s))); }
have() { grep -q "^$1,$2,$3," "$CSV"; }
read -r NL C H HKV F V TIED BLK R TGT < <(python3 - "$CONFIG" <<'PY'
import sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb")); m = c["model"]; lo = c.get("lora", {})
print(m["n_layers"], m["d_model"], m["n_heads"], m["n_kv_heads"], m["ffn_dim"], m.get("vocab_size") or 259,
      int(m.get("tie_embeddings", True)), c.get("attention", {}).get("block_size", 128), lo.get("rank", 16),
      lo.get("targets", "q,k,v,o,gate,up,down").replace(" ", ""))
PY
) || { echo "cannot read [model] of $CONFIG"; exit 1; }
[ "$TINY" = 1 ] && R=4
# FLOPs per token (see the header) and MFU from tokens/s: both rows through this one function
mfu() {  # L density tokens_per_s
  python3 - "$1" "$2" "$3" $NL $C $H $HKV $F $V $R "$TGT" <<'PY'
import sys
L, dens, tps = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
Lyr, C, H, Hkv, F, V, r = map(int, sys.argv[4:11]); tg = sys.argv[11].split(",")
D = C // H
io = {"q": (C, H * D), "k": (C, Hkv * D), "v": (C, Hkv * D), "o": (H * D, C), "gate": (C, F), "up": (C, F), "down": (F, C)}
n_lin = Lyr * (sum(i * o for i, o in io.values()) + 2 * C) + C + V * C
n_ad = Lyr * sum(r * (io[t][0] + io[t][1]) for t in tg)
fpt = 4 * n_lin + 6 * n_ad + 3 * 4 * Lyr * H * D * dens * (L + 1) / 2
print(f"{fpt * tps / 989e12:.4f}")
PY
}
pub() { cp "$CSV" "$OUTDIR/lora7b.csv"; }
shape=(--layers "$NL" --d-model "$C" --heads "$H" --kv-heads "$HKV" --ffn "$F" --vocab "$V" --block "$BLK" --rank "$R")
[ "$TIED" = 1 ] || shape+=(--untied)
for L in $LENS; do
  data=$W/data_$L
  [ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 4 --max-len "$L" --min-len "$L" \
      --output "$data" > /dev/null || exit 1
  for mode in $MODES; do
    tag=${L}_$mode
    sets=(--set data.path="$data" --set data.val_fraction=0 --set train.micro_batch_tokens="$L"
          --set train.global_batch_tokens="$L" --set attention.mode=$mode --set lora.rank="$R" "${extra[@]}")
    # lora.rank: a config without [lora] (e.g. the 0.5B shape) runs LoRA too, as the plan's row it is measured against
    # the plan: the LoRA row at train.zero = 0 (the run's own setting), its total MiB
    plan=$("$SB" memory "$CONFIG" "${sets[@]}" --ranks 1 2>&1 | tee "$OUTDIR/plan_$tag.log" \
           | python3 -c "import re,sys
for l in sys.stdin:
    if l.startswith('LoRA r') and 'train.zero = 0' in l: print(f'{float(re.findall(r\"[0-9.]+\", l.split(\"train.zero = 0\")[1])[-1]) / 1024:.3f}')")
    [ -n "$plan" ] || { echo "sparsebalance memory failed ($tag):"; tail -5 "$OUTDIR/plan_$tag.log"; plan=0; }
    if ! have sparsebalance "$L" $mode; then
      [ "$(left)" -gt "$MIN_SB_S" ] || { echo "deadline: not starting ours $tag ($(left) s left)"; continue; }
      sum=$W/sb_$tag.json; rm -f "$sum" "$W/metrics_$tag.h5"
      if timeout "$(left)" "$SB" train "$CONFIG" "${sets[@]}" --set train.steps="$STEPS" --set train.warmup_steps=1 \
          --set balance.tuning=fixed --set balance.self_profile=false --set log.progress=false --set log.every=1 \
          --set train.sync_check_every=0 --set checkpoint.dir=/proc/sb-no-checkpoint --set checkpoint.on_error=continue \
          --set log.path="$W/metrics_$tag.h5" --summary "$sum" > "$OUTDIR/sb_$tag.log" 2>&1; then
        read -r dens ms tps peak fl ll < <(python3 - "$sum" "$L" "$mode" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1])); L = int(sys.argv[2])
ms = statistics.median(s["step_ms"][1:] or s["step_ms"])
d = s["mean_density"] if sys.argv[3] == "sparse" else 1.0
print(f"{d:.4f} {ms:.1f} {L / (ms / 1e3):.0f} {s.get('peak_mem_gib', 0):.2f} {s['first_loss']:.4f} {s['last_loss']:.4f}")
PY
)
        # the CPU (TINY) has no device peak: its peak host memory from the memory line
        [ "$peak" = 0.00 ] && peak=$(sed -nE 's/.*peak host ([0-9.]+) MiB.*/\1/p' "$OUTDIR/sb_$tag.log" | tail -1 | awk '{printf "%.4f", $1 / 1024}')
        ratio=$(python3 -c "print(f'{$peak / $plan:.3f}' if $plan > 0 else '')")
        echo "sparsebalance,$L,$mode,$dens,$ms,$tps,$(mfu "$L" "$dens" "$tps"),$peak,$plan,$ratio,$fl,$ll" >> "$CSV"; pub
        grep -E "^(memory per rank|gpu memory per rank)" "$OUTDIR/sb_$tag.log" | tail -1
      else
        echo "sparsebalance train failed or cut ($tag):"; tail -8 "$OUTDIR/sb_$tag.log"
      fi
    fi
    [ "$TORCH" = 1 ] || continue
    have pytorch "$L" $mode && continue
    [ "$(left)" -gt "$MIN_TORCH_S" ] || { echo "deadline: not starting PyTorch $tag ($(left) s left)"; continue; }
    dens=1.0; targs=(--attention dense)
    if [ $mode = sparse ]; then
      dens=$(grep "^sparsebalance,$L,sparse," "$CSV" | tail -1 | cut -d, -f4)
      [ -n "$dens" ] || { echo "no density of ours for PyTorch $tag"; continue; }
      targs=(--attention sparse --density "$dens")
    fi
    tcsv=$W/torch_$tag.csv; rm -f "$tcsv"
    # compiled decoder layers first; if that fails (not cut, not OOM: e.g. a compile error around peft's
    # layers under checkpointing), once more eager with FlexAttention alone compiled
    for comp in layers off; do
      PYTHONUNBUFFERED=1 timeout "$(left)" python3 bench/torch/torch_lora_ref.py --seq "$L" "${targs[@]}" "${shape[@]}" \
        --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" --compile $comp --csv "$tcsv" > "$OUTDIR/torch_${tag}_$comp.log" 2>&1
      rc=$?
      [ $rc = 0 ] && break
      echo "PyTorch failed or cut ($tag, compile $comp, exit $rc):"; tail -5 "$OUTDIR/torch_${tag}_$comp.log"
      [ $rc != 124 ] && [ "$(left)" -gt 60 ] || break
    done
    [ -f "$tcsv" ] || continue
    IFS=, read -r st kept ms tps peak fl ll < <(python3 - "$tcsv" <<'PY'
import csv, sys
r = list(csv.DictReader(open(sys.argv[1])))[-1]
print(",".join(r[k] for k in ["status", "kept_frac", "step_ms_median", "tokens_per_s", "peak_mem_gib", "loss_first", "loss_last"]))
PY
)
    if [ "$st" = ok ]; then
      echo "pytorch,$L,$mode,$kept,$ms,${tps%.*},$(mfu "$L" "$kept" "$tps"),$peak,,,$fl,$ll" >> "$CSV"
    else
      echo "pytorch,$L,$mode,$kept,,,,$st,,,," >> "$CSV"
    fi
    pub
  done
done
pub
{ command -v column >/dev/null && column -s, -t || cat; } < "$CSV"  # no util-linux column on the GPU image
