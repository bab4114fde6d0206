#!/usr/bin/env bash
# The ablation: real CPU training with MPI for the four balancing policies on the same data and
# steps, each evaluated; then the same policies in `simulate` at 8, 64, 512 and 4096 ranks.
#   bash bench/studies/ablation.sh [BUILD_DIR] [RANKS] [STEPS]
# Writes bench/out/ablation/<policy>/{train,eval}.json and prints Markdown tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}; RANKS=${2:-2}; STEPS=${3:-30}
SB=$BUILD/src/sparsebalance
OUT=bench/out/ablation
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
mkdir -p $OUT
DATA=$OUT/data
# A long-tail corpus whose longest documents fill a micro-batch: the regime balancing is for.
[ -f $DATA/shard_00000.h5 ] || $SB prep synth --preset longalign --docs 3000 --seed 7 --max-len 4096 --min-len 64 --output $DATA >/dev/null
COMMON="--set data.path=$DATA --set train.steps=$STEPS --set train.global_batch_tokens=$((RANKS*8192)) \
  --set train.micro_batch_tokens=4096 --set attention.block_size=64 --set attention.k=4 --set model.d_model=64 \
  --set log.progress=false --set eval.docs=64"
policies="sequential:fixed sparse:fixed sequential:dst sparse:dst"
for p in $policies; do
  b=${p%%:*}; t=${p##*:}; dir=$OUT/$b+$t
  rm -rf $dir; mkdir -p $dir
  mpirun -np $RANKS $SB train configs/tiny.toml $COMMON --set balance.batching=$b --set balance.tuning=$t \
    --set checkpoint.dir=$dir/ckpt --set log.path=$dir/metrics.h5 --summary $dir/train.json > $dir/train.log
  mpirun -np $RANKS $SB eval configs/tiny.toml $COMMON --set checkpoint.dir=$dir/ckpt --checkpoint latest \
    --summary $dir/eval.json > $dir/eval.log
done
/usr/bin/python3 - "$OUT" $policies <<'PY'
import json, sys
out, pols = sys.argv[1], sys.argv[2:]
rows = []
for p in pols:
    name = p.replace(":", "+")
    t = json.load(open(f"{out}/{name}/train.json")); e = json.load(open(f"{out}/{name}/eval.json"))
    rows.append((name, t, e))
base = rows[0][1]["mean_step_ms"]
print("| policy | step ms | speedup | imbalance | bubble | density | recall | pred. error | final loss | eval loss (sparse) | task acc. (sparse) | budgets >k0 / <k0 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, t, e in rows:
    print(f"| {name} | {t['mean_step_ms']:.1f} | {base / t['mean_step_ms']:.3f} | {t['mean_imbalance']:.3f} | {t['mean_bubble']:.3f} | "
          f"{t['mean_density']:.3f} | {t['mean_recall']:.3f} | {t['mean_pred_error']:.3f} | {t['last_loss']:.4f} | "
          f"{e['loss_sparse']:.4f} | {e['task_accuracy_sparse']['overall']['accuracy']:.3f} | {t['budgets_above_k0']} / {t['budgets_below_k0']} |")
PY
echo
if [ -x bench/studies/simulate_table.sh ]; then bash bench/studies/simulate_table.sh "$BUILD"; fi
