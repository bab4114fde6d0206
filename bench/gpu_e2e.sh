#!/usr/bin/env bash
# End-to-end training throughput on one GPU: `sparsebalance train configs/gpu_0p5b.toml` (0.47B
# parameters) dense and sparse at each context length, beside the same model in PyTorch
# (bench/torch_model_ref.py: cuDNN for dense, FlexAttention for sparse at the density our gating
# kept). Run on the GPU machine after jobs/gpu/build_on_gpu.sh (SB = the binary it built).
#   LENS="16384 32768" STEPS=8 bash bench/gpu_e2e.sh        # table on stdout, CSV in $OUT
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
mkdir -p "$OUTDIR" runs/gpu_e2e
CSV=$OUTDIR/gpu_e2e.csv
echo "impl,L,attention,density,step_ms,tokens_per_s,mfu,first_loss,last_loss" > "$CSV"
for L in $LENS; do
  data=runs/gpu_e2e/data_$L
  [ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset fixed --docs 24 --max-len "$L" --min-len "$L" \
      --output "$data" > /dev/null || exit 1
  for mode in dense sparse; do
    tuning=fixed; [ $mode = sparse ] && tuning=dst
    sum=runs/gpu_e2e/sb_${L}_$mode.json
    rm -rf runs/gpu_e2e/ckpt_${L}_$mode
    "$SB" train configs/gpu_0p5b.toml --set data.path="$data" --set data.val_fraction=0 \
      --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set train.steps="$STEPS" \
      --set attention.mode=$mode --set balance.tuning=$tuning --set checkpoint.dir=runs/gpu_e2e/ckpt_${L}_$mode \
      --set log.path=runs/gpu_e2e/metrics_${L}_$mode.h5 --summary "$sum" > "$OUTDIR/sb_${L}_$mode.log" 2>&1 \
      || { echo "sparsebalance train failed (L=$L $mode):"; tail -20 "$OUTDIR/sb_${L}_$mode.log"; continue; }
    python3 - "$sum" "$L" "$mode" >> "$CSV" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1])); L = int(sys.argv[2]); mode = sys.argv[3]
Lyr, C, H, Hkv, D, F, V = 24, 1280, 10, 2, 128, 3584, 32768
n_lin = Lyr * (2 * C + C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * F) + C + V * C
ms = statistics.median(s["step_ms"][2:] or s["step_ms"])
tok = 2 * L  # two micro-batches of one L-token document per step
dens = s["mean_density"] if mode == "sparse" else 1.0
pairs_per_token = dens * (L + 1) / 2
fpt = 6 * n_lin + 3 * 4 * Lyr * H * D * pairs_per_token
tps = tok / (ms / 1e3)
print(f"sparsebalance,{L},{mode},{dens:.4f},{ms:.1f},{tps:.0f},{fpt * tps / 989e12:.4f},{s['first_loss']:.4f},{s['last_loss']:.4f}")
PY
    rm -rf runs/gpu_e2e/ckpt_${L}_$mode  # 5.6 GB each (weights and moments)
    if [ "$TORCH" = 1 ]; then
      dens=$(tail -1 "$CSV" | cut -d, -f4)
      targs=(--attention dense)
      [ $mode = sparse ] && targs=(--attention sparse --density "$dens")
      timeout 300 python3 bench/torch_model_ref.py --seq "$L" "${targs[@]}" --steps 6 --warmup 3 \
        --csv "$OUTDIR/torch_ref.csv" > "$OUTDIR/torch_${L}_$mode.log" 2>&1 || { echo "torch ref failed (L=$L $mode)"; tail -5 "$OUTDIR/torch_${L}_$mode.log"; }
      python3 - "$OUTDIR/torch_ref.csv" "$L" "$mode" >> "$CSV" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["seq"] == sys.argv[2] and r["attention"] == sys.argv[3]]
if rows:
    r = rows[-1]
    print(f"pytorch,{r['seq']},{r['attention']},{r.get('kept_frac') or 1},{r['step_ms_median']},"
          f"{float(r['tokens_per_s']) if r['tokens_per_s'] else 0:.0f},{r['mfu']},{r['loss_first']},{r['loss_last']}")
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
