#!/usr/bin/env bash
# Issue 48's gate measurement, after the accuracy recipe (bench/gpu/accuracy.sh) on the same machine:
#   1. read: the recipe's dense `long` model (it retrieves at 8K-16K) evaluated with sparse attention at
#      k0 under each gate variant of GATE_READ (bench/gpu/gate_variants.sh), no training: which gate
#      keeps the blocks a model that attends densely needs. The `base` row also gives its dense accuracy.
#   2. train: sparse long fine-tunes from the recipe's `short` model (bench/gpu/accuracy_policies.sh,
#      POL_FROM=short, policy fixed+VARIANT) with the recipe's own `long` stage's steps, batch, learning
#      rate and data, so the recipe's dense `long` is their dense control (issue 48 item 4, one seed per
#      call budget; GATE_SEEDS adds more).
#
#   SB=build-gpu/src/sparsebalance ACC_BUDGET_S=500 bash bench/gpu/accuracy_gates.sh   # the GPU machine
#   ACC_SCALE=tiny GATE_STEPS=4 bash bench/gpu/accuracy_gates.sh                        # CPU: the pipeline
#   ACC_SCALE=proxy bash bench/gpu/accuracy_gates.sh        # CPU proxy (bench/studies/accuracy_proxy.sh first):
#                                                           # its `long` model (1K-2K) read at k0 = 4 blocks of 32
#
# GATE_MODEL=short reads the recipe's `short` model instead (it retrieves up to 4K: 100% at 2K-4K on the
# H200), on a held-out corpus of 1K-4K documents of its own (seed 98), at GATE_K (default 4 blocks of 64,
# ~8% of a 4K document's causal blocks, about the share k0 = 16 keeps at 16K): the gates compared
# without the `long` stage (~7 minutes less of GPU time); no fine-tunes unless GATE_TRAIN names them.
# Resumable like the recipe (ACC_DEADLINE / ACC_BUDGET_S; last line `gates: done` or `gates: continue`).
# Env: ACC_SCALE (gpu|proxy|tiny), SB, ACC_RUNS (the recipe's runs), GATE_RUNS (runs/gates_$ACC_SCALE),
# GATE_READ (variants read), GATE_TRAIN (variants fine-tuned; `auto`: base and the best read variant
# without qmax parts, whose gating is too slow to train with, bench/results/2026-12-07-gate-modes-gpu.md),
# GATE_SEEDS ("1"), GATE_STEPS / GATE_BATCH / GATE_LR / GATE_WARMUP (the recipe's long stage: gpu 600,
# 262144, 5e-4, 30), GATE_EVAL_DOCS (256), OUT (copies of the tables).
# Env also: GATE_MODEL (long|short, above), GATE_K (attention.k of the reads; short: 4), GATE_DIAG_DOCS
# (documents of the diagnostics pass, 96; 0: none; writes diag.json and diag.md).
# Writes $GATE_RUNS/read/VARIANT.json (eval summaries), read.md (bench/analysis/gate_sweep.py), and
# $GATE_RUNS/train/ (accuracy_policies.sh's runs, policies.md).
set -uo pipefail
SCALE=${ACC_SCALE:-gpu}
SB=${SB:-build/src/sparsebalance}
ACC=${ACC_RUNS:-runs/accuracy_$SCALE}
RUNS=${GATE_RUNS:-runs/gates_$SCALE}
OUTDIR=${OUT:-$RUNS/out}
CFG=configs/accuracy_$SCALE.toml
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
READ=${GATE_READ:-"base kbounds ksub qmax qmax+kbounds base+w4 base+dl2 kbounds+dl2"}
MODEL=${GATE_MODEL:-long}
case $MODEL in long|short) ;; *) echo "accuracy_gates.sh: GATE_MODEL=$MODEL: expected long or short" >&2; exit 1 ;; esac
START=$(date +%s)
if [ -n "${ACC_DEADLINE:-}" ]; then DEADLINE=$ACC_DEADLINE
elif [ -n "${ACC_BUDGET_S:-}" ]; then DEADLINE=$((START + ACC_BUDGET_S))
else DEADLINE=$((START + 10 ** 9)); fi
export ACC_DEADLINE=$DEADLINE
case $SCALE in
  gpu)  STEPS=${GATE_STEPS:-600}; GB=${GATE_BATCH:-262144}; LR=${GATE_LR:-5e-4}; WU=${GATE_WARMUP:-30}; FROM=8193; EVAL_S=40 ;;
  tiny) STEPS=${GATE_STEPS:-4}; GB=${GATE_BATCH:-8192}; LR=${GATE_LR:-1e-3}; WU=${GATE_WARMUP:-1}; FROM=1025; EVAL_S=3 ;;
  proxy) STEPS=${GATE_STEPS:-60}; GB=${GATE_BATCH:-8192}; LR=${GATE_LR:-1e-3}; WU=${GATE_WARMUP:-5}; FROM=1025; EVAL_S=20 ;;
  *) echo "accuracy_gates.sh: ACC_SCALE=$SCALE: expected gpu, proxy or tiny" >&2; exit 1 ;;
esac
# shellcheck source=bench/gpu/gate_variants.sh
. "$(dirname "$0")/gate_variants.sh"
for f in "$ACC/final_$MODEL" "$ACC/final_short" "$ACC/data_eval/.done"; do
  [ -f "$f" ] || { echo "accuracy_gates.sh: $f missing: run ACC_SCALE=$SCALE ACC_UNTIL=$MODEL bash bench/gpu/accuracy.sh to the end of its $MODEL stage first" >&2; exit 1; }
done
[ -x "$SB" ] || { echo "accuracy_gates.sh: $SB not found (build sparsebalance, or set SB)" >&2; exit 1; }
mkdir -p "$RUNS/read" "$OUTDIR"
log() { echo "== $(date -u +%H:%M:%S) $*"; }
left() { echo $((DEADLINE - $(date +%s))); }
MICRO=$(grep -E '^micro_batch_tokens' "$CFG" | sed -E 's/[^=]*= *([0-9]+).*/\1/')
EVAL_SEED=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb")).get("data", {}).get("seed", 1234))' "$CFG") || exit 1
EVAL_DATA=$ACC/data_eval
if [ "$MODEL" = short ]; then  # a held-out corpus at the lengths `short` solves
  EVAL_DATA=$RUNS/data_eval_short
  if [ ! -f "$EVAL_DATA/.done" ]; then
    lo=1024 hi=4096 n=300; [ "$SCALE" = tiny ] && { lo=256; hi=1024; n=40; }
    "$SB" prep synth --preset uniform --min-len $lo --max-len $hi --docs $n --seed 98 --mask answers --ask one \
      --output "$EVAL_DATA" --overwrite > "$RUNS/prep_eval_short.log" 2>&1 || { cat "$RUNS/prep_eval_short.log"; exit 1; }
    touch "$EVAL_DATA/.done"
  fi
  FROM=$(( $([ "$SCALE" = tiny ] && echo 512 || echo 2048) + 1 ))
fi
EVAL_SETS=(--set data.path="$EVAL_DATA" --set data.val_fraction=0.9 --set train.micro_batch_tokens="$MICRO"
           --set data.seed="$EVAL_SEED")
[ "$SCALE" = gpu ] && EVAL_SETS+=(--set eval.docs="${GATE_EVAL_DOCS:-256}")
[ "$MODEL" = short ] && EVAL_SETS+=(--set attention.k="${GATE_K:-4}")
[ -n "${GATE_K:-}" ] && [ "$MODEL" = long ] && EVAL_SETS+=(--set attention.k="$GATE_K")
LONG=$(cat "$ACC/final_$MODEL")
log "gates ($SCALE): read $LONG ($MODEL) under [$READ], lengths >= $FROM; $(left) s in this call"

status=done
for v in $READ; do
  js=$RUNS/read/$v.json
  [ -f "$js" ] && continue
  if [ "$(left)" -lt "$EVAL_S" ]; then status=continue; break; fi
  sets=$(gate_variant_sets "$v") || exit 1
  # shellcheck disable=SC2086  # $sets: one word per flag
  "$SB" eval --checkpoint "$LONG" "${EVAL_SETS[@]}" $sets --summary "$js.tmp" > "$RUNS/read/$v.log" 2>&1 \
    && mv "$js.tmp" "$js" || { echo "accuracy_gates.sh: eval of $LONG under $v failed:"; tail -5 "$RUNS/read/$v.log"; exit 1; }
  echo "read $v: $(grep -E 'task overall' "$RUNS/read/$v.log" | sed 's/^ *//')"
done
if compgen -G "$RUNS/read/*.json" > /dev/null; then
  "$PY" bench/analysis/gate_sweep.py "$RUNS/read" --from "$FROM" --md "$RUNS/read.md" --best "$RUNS/best" || exit 1
  cp "$RUNS/read.md" "$OUTDIR/"
fi

# The diagnostics of the default gate (eval --diagnose: needle ranks, the oracle gate, true against
# gate recall, one layer at a time dense or sparse) on GATE_DIAG_DOCS documents, when time is left.
if [ "$status" = done ] && [ "${GATE_DIAG_DOCS:-96}" != 0 ] && [ ! -f "$RUNS/diag.md" ] && [ "$(left)" -ge $((2 * EVAL_S)) ]; then
  "$SB" eval --checkpoint "$LONG" "${EVAL_SETS[@]}" --set eval.docs="${GATE_DIAG_DOCS:-96}" --diagnose "$RUNS/diag.json" \
    > "$RUNS/diag.log" 2>&1 && "$PY" bench/analysis/diagnose_table.py "$RUNS/diag.json" > "$RUNS/diag.md" \
    && cp "$RUNS/diag.md" "$OUTDIR/" && cat "$RUNS/diag.md" || { echo "accuracy_gates.sh: diagnostics failed:"; tail -5 "$RUNS/diag.log"; }
fi
TRAIN=${GATE_TRAIN:-$([ "$MODEL" = long ] && echo auto)}
if [ "$status" = done ] && [ -n "$TRAIN" ]; then
  [ "$TRAIN" = auto ] && TRAIN="base $(cat "$RUNS/best")"
  pols=$(for v in $TRAIN; do echo "fixed+$v"; done | awk '!seen[$0]++' | tr '\n' ' ')
  log "train: $pols from $(cat "$ACC/final_short"), $STEPS steps of $GB tokens, lr $LR"
  POL_SCALE=$SCALE POL_FROM=short POL_RUNS="$RUNS/train" POL_NP=1 POL_POLICIES="$pols" \
    POL_SEEDS="${GATE_SEEDS:-1}" POL_STEPS=$STEPS POL_BATCH=$GB POL_LR=$LR POL_WARMUP=$WU \
    POL_START_EVAL=0 POL_EVAL_DOCS="${GATE_EVAL_DOCS:-256}" OUT=$OUTDIR SB=$SB ACC_RUNS=$ACC \
    bash bench/gpu/accuracy_policies.sh | tee "$RUNS/train.log"
  tail -1 "$RUNS/train.log" | grep -q 'policies: done' || status=continue
fi
log "gates: $status (elapsed $(( $(date +%s) - START )) s)"
