#!/usr/bin/env bash
# The paper's accuracy comparison: the long-context fine-tuning stage of the accuracy recipe
# (bench/gpu/accuracy.sh) run with each attention/balancing policy from the same starting weights, data,
# seed and step count, several seeds each, then evaluated on the recipe's held-out documents.
#
#   POL_SCALE=tiny bash bench/gpu/accuracy_policies.sh        # CPU, after ACC_SCALE=tiny bash bench/gpu/accuracy.sh
#   POL_SCALE=gpu SB=build-gpu/src/sparsebalance bash bench/gpu/accuracy_policies.sh   # one H200, after the recipe
#
# Policies (POL_POLICIES): dense (dense attention), fixed (block-sparse, budget k0 everywhere), and
# dst_mean, dst_max, dst_recall (block-sparse, budgets tuned by DST with balance.target = mean, max,
# recall; dst_recall_true, not in the default list: target recall with the recall model fed true recall,
# balance.recall_rows = 8). All use SAB batching (balance.batching = sparse), so the sparse ones differ only in their
# budgets. POL_NP ranks (default 2) share ONE device: DST needs several ranks to have bubbles to fill.
# Their budgets are planned from one fixed latency profile, measured once on one rank alone
# (`sparsebalance profile`), with the online correction off (balance.ema = 0): ranks sharing a device
# slow each other down, and a corrected model would chase that. So the step times here order the
# policies by the work they planned; they are not speed figures.
# Start: the recipe's finished POL_FROM stage (default `long`: the dense model that retrieves at
# 8K-16K, so the policies are sparse fine-tunes of a model that solves the tasks, as the paper
# fine-tunes pretrained models; `short`: the model that retrieves up to 4K only; POL_INIT overrides);
# A policy name may carry a gate variant after '+' (bench/gpu/gate_variants.sh), e.g. fixed+kbounds+dl2.
# data: the recipe's `long` corpus (4K-16K); eval: the recipe's held-out corpus (data_eval), dense and sparse
# at k0. Seeds (POL_SEEDS, default "1 2 3") set data.seed (the document order) and train.seed.
# Resumable in bounded calls like bench/gpu/accuracy.sh (ACC_DEADLINE / ACC_BUDGET_S; last line
# `policies: done` or `policies: continue`). Writes $POL_RUNS/policies.csv, policies.md (tables for
# bench/results/2026-12-02-policy-comparison-gpu.md) and policies.png (accuracy against step time), copied to $OUT.
# Env: POL_SCALE (tiny|proxy|gpu), SB, ACC_RUNS (the recipe's runs), POL_FROM, POL_RUNS (runs/policies_$POL_SCALE),
# POL_STEPS, POL_BATCH (global batch tokens), POL_NP, POL_SEEDS, POL_POLICIES, POL_MAX_CHANGE (0.25),
# POL_LR (the fine-tunes' peak train.lr; unset: the config's), POL_WARMUP (warmup steps; default POL_STEPS/10), POL_START_EVAL (0: skip the start's eval), POL_EVAL_DOCS (gpu: 256 of the 384
# held-out documents), OUT. The starting checkpoint itself is evaluated first ($POL_RUNS/start):
# the tables' first rows, so what the fine-tunes add or lose is read against where they began.
set -uo pipefail
SCALE=${POL_SCALE:-tiny}
SB=${SB:-build/src/sparsebalance}
ACC=${ACC_RUNS:-runs/accuracy_$SCALE}
RUNS=${POL_RUNS:-runs/policies_$SCALE}
OUTDIR=${OUT:-$RUNS/out}
CFG=configs/accuracy_$SCALE.toml
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
NP=${POL_NP:-2}
SEEDS=${POL_SEEDS:-"1 2 3"}
POLICIES=${POL_POLICIES:-"dense fixed dst_mean dst_max dst_recall"}
MAXC=${POL_MAX_CHANGE:-0.25}
LR_SETS=(); [ -n "${POL_LR:-}" ] && LR_SETS=(--set train.lr="$POL_LR")
START=$(date +%s)
if [ -n "${ACC_DEADLINE:-}" ]; then DEADLINE=$ACC_DEADLINE
elif [ -n "${ACC_BUDGET_S:-}" ]; then DEADLINE=$((START + ACC_BUDGET_S))
else DEADLINE=$((START + 10 ** 9)); fi
case $SCALE in
  gpu)  STEPS=${POL_STEPS:-100}; GB=${POL_BATCH:-131072}; FROM=8193; PROF=(); MIN_RUN_S=60; EVAL_S=30 ;;
  tiny) STEPS=${POL_STEPS:-4};   GB=${POL_BATCH:-8192};   FROM=1025; PROF=(--quick); MIN_RUN_S=5; EVAL_S=3 ;;
  proxy) STEPS=${POL_STEPS:-60}; GB=${POL_BATCH:-8192};   FROM=1025; PROF=(--quick); MIN_RUN_S=20; EVAL_S=30 ;;
  *) echo "accuracy_policies.sh: POL_SCALE=$SCALE: expected tiny, proxy or gpu" >&2; exit 1 ;;
esac
[ -x "$SB" ] || { echo "accuracy_policies.sh: $SB not found (build sparsebalance, or set SB)" >&2; exit 1; }
FROM_STAGE=${POL_FROM:-long}
INIT=${POL_INIT:-$(cat "$ACC/final_$FROM_STAGE" 2>/dev/null)}
for f in "$INIT" "$ACC/data_long/.done" "$ACC/data_eval/.done"; do
  [ -n "$f" ] && [ -f "$f" ] || { echo "accuracy_policies.sh: ${f:-the finished $FROM_STAGE stage ($ACC/final_$FROM_STAGE)} missing: run ACC_SCALE=$SCALE [ACC_UNTIL=$FROM_STAGE] bash bench/gpu/accuracy.sh first (or set POL_INIT)" >&2; exit 1; }
done
mkdir -p "$RUNS" "$OUTDIR"
# mpirun as root on the GPU machine; the private prefix's libraries (LD_LIBRARY_PATH) and NVLink
# multicast off (jobs/gpu/README.md) passed to every rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
MPI=(mpirun -np "$NP" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
log() { echo "== $(date -u +%H:%M:%S) $*"; }
left() { echo $((DEADLINE - $(date +%s))); }
MICRO=$(grep -E '^micro_batch_tokens' "$CFG" | sed -E 's/[^=]*= *([0-9]+).*/\1/')
# data.seed picks the held-out split: the recipe's (the config's), not each run's training seed, so
# every policy and seed is read on the same documents as the recipe's own evaluation.
# (1234 is the schema's default of data.seed, for a config without one.)
EVAL_SEED=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb")).get("data", {}).get("seed", 1234))' "$CFG") || exit 1
EVAL_SETS=(--set data.path="$ACC/data_eval" --set data.val_fraction=0.9 --set train.micro_batch_tokens="$MICRO"
           --set data.seed="$EVAL_SEED")
[ "$SCALE" = gpu ] && EVAL_SETS+=(--set eval.docs="${POL_EVAL_DOCS:-256}")
[ "$SCALE" != gpu ] && [ -n "${POL_EVAL_DOCS:-}" ] && EVAL_SETS+=(--set eval.docs="$POL_EVAL_DOCS")
log "policies ($SCALE): $POLICIES x seeds $SEEDS, $STEPS steps of $GB tokens, $NP ranks on one device, from $INIT; $(left) s in this call"

# The latency profile: once, one rank alone, sparse attention (the plan prices dense from it too).
if [ ! -f "$RUNS/profile.h5" ]; then
  "$SB" profile "$CFG" "${PROF[@]}" --set attention.mode=sparse --set data.path="$ACC/data_long" \
    --output "$RUNS/profile.h5.tmp" > "$RUNS/profile.log" 2>&1 || { echo "profile failed:"; tail -10 "$RUNS/profile.log"; exit 1; }
  mv "$RUNS/profile.h5.tmp" "$RUNS/profile.h5"
  tail -3 "$RUNS/profile.log"
fi

# shellcheck source=bench/gpu/gate_variants.sh
. "$(dirname "$0")/gate_variants.sh"
policy_sets() {  # policy_sets NAME[+GATE]: its --set flags; a '+' suffix names a gate variant (gate_variants.sh)
  case $1 in
    *+*) local g; g=$(gate_variant_sets "${1#*+}") || return 1; echo "$(policy_sets "${1%%+*}") $g"; return ;;
    dense)      echo "--set attention.mode=dense --set balance.tuning=fixed" ;;
    fixed)      echo "--set attention.mode=sparse --set balance.tuning=fixed" ;;
    dst_mean)   echo "--set attention.mode=sparse --set balance.tuning=dst --set balance.target=mean" ;;
    dst_max)    echo "--set attention.mode=sparse --set balance.tuning=dst --set balance.target=max" ;;
    dst_recall) echo "--set attention.mode=sparse --set balance.tuning=dst --set balance.target=recall" ;;
    # the recall model fed true recall (8 sampled rows per layer and micro-batch, every step), not the gate's
    dst_recall_true) echo "--set attention.mode=sparse --set balance.tuning=dst --set balance.target=recall --set balance.recall_rows=8" ;;
    *) echo "accuracy_policies.sh: unknown policy '$1' (dense fixed dst_mean dst_max dst_recall dst_recall_true)" >&2; return 1 ;;
  esac
}

# The starting checkpoint, evaluated as the policies will be (dense and sparse at k0); POL_START_EVAL=0 skips it.
if [ "${POL_START_EVAL:-1}" != 0 ] && [ ! -f "$RUNS/start/eval.json" ] && [ "$(left)" -ge "$EVAL_S" ]; then
  mkdir -p "$RUNS/start"
  "$SB" eval --checkpoint "$INIT" "${EVAL_SETS[@]}" --summary "$RUNS/start/eval.json.tmp" > "$RUNS/start/eval.log" 2>&1 \
    && mv "$RUNS/start/eval.json.tmp" "$RUNS/start/eval.json" || { echo "accuracy_policies.sh: eval of $INIT failed:"; tail -5 "$RUNS/start/eval.log"; exit 1; }
  echo "start: $(grep -E 'task overall' "$RUNS/start/eval.log" | sed 's/^ *//')"
fi

status=done
for seed in $SEEDS; do
  for pol in $POLICIES; do
    d=$RUNS/${pol}_s$seed
    [ -f "$d/eval.json" ] && continue
    sets=$(policy_sets "$pol") || exit 1
    final=$d/ckpt/$(printf 'ckpt_%08d.h5' "$STEPS")
    if [ ! -f "$final" ]; then
      if [ "$(left)" -lt "$MIN_RUN_S" ]; then status=continue; break 2; fi
      mkdir -p "$d"
      # shellcheck disable=SC2086  # $sets: one word per flag
      timeout -s USR1 -k 60 $(( $(left) - EVAL_S )) "${MPI[@]}" "$SB" train "$CFG" --resume --init-from "$INIT" $sets \
        --set balance.batching=sparse --set balance.profile="$RUNS/profile.h5" --set balance.ema=0 \
        --set balance.self_profile=false --set balance.max_change="$MAXC" "${LR_SETS[@]}" \
        --set data.path="$ACC/data_long" --set data.seed="$seed" --set train.seed="$seed" \
        --set train.steps="$STEPS" --set train.global_batch_tokens="$GB" --set train.warmup_steps="${POL_WARMUP:-$((STEPS / 10))}" \
        --set checkpoint.dir="$d/ckpt" --set checkpoint.every=0 --set checkpoint.keep=1 \
        --set log.path="$d/metrics.h5" --set log.progress=false --summary "$d/train.json" >> "$d/train.log" 2>&1
      rc=$?
      if [ ! -f "$final" ]; then
        [ $rc = 0 ] || [ $rc = 124 ] || { echo "accuracy_policies.sh: $pol seed $seed failed (rc $rc):"; tail -20 "$d/train.log"; exit 1; }
        status=continue; break 2
      fi
      echo "$pol seed $seed: $(grep -E '^done' "$d/train.log" | tail -1)"
    fi
    if [ "$(left)" -lt "$EVAL_S" ]; then status=continue; break 2; fi
    "$SB" eval --checkpoint "$final" "${EVAL_SETS[@]}" --summary "$d/eval.json.tmp" > "$d/eval.log" 2>&1 \
      && mv "$d/eval.json.tmp" "$d/eval.json" || { echo "accuracy_policies.sh: eval of $final failed:"; tail -5 "$d/eval.log"; exit 1; }
    echo "$pol seed $seed: $(grep -E 'task overall' "$d/eval.log" | sed 's/^ *//')"
    rm -f "$d"/ckpt/ckpt_*.h5  # the weights are not needed after the eval (330 MB each at gpu scale)
  done
done

if compgen -G "$RUNS/*_s*/eval.json" > /dev/null; then
  "$PY" bench/analysis/accuracy_policies.py "$RUNS" --from "$FROM" --csv "$RUNS/policies.csv" --md "$RUNS/policies.md" || exit 1
  "$PY" jobs/plots/plot_accuracy.py policies "$RUNS/policies.csv" --out "$RUNS/policies.png" \
    --title "policies ($SCALE, $NP ranks on one device): accuracy vs step time" || echo "accuracy_policies.sh: no plot (matplotlib?)"
  for f in policies.csv policies.md policies.png; do [ -f "$RUNS/$f" ] && cp "$RUNS/$f" "$OUTDIR/"; done
fi
log "policies: $status (elapsed $(( $(date +%s) - START )) s)"
