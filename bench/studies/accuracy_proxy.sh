#!/usr/bin/env bash
# The CPU proxy of the accuracy recipe (issue 48): a 3-layer model (configs/accuracy_proxy.toml,
# blocks of 32, 1K-2K tokens) trained on a 2-core CPU by the recipe of bench/gpu/accuracy.sh
# (ACC_SCALE=proxy: copy on 4-16 characters, copy2 on 16-64, short answers, long answers), then the
# diagnostics of its last checkpoint on held-out 1K-2K documents, dense against sparse at k0 and at
# twice k0 (`sparsebalance eval --diagnose`, rendered by bench/analysis/diagnose_table.py), so gate
# choices and the diagnostics can be compared without a GPU. A hand run of these stages learned passkey
# retrieval (a third of the 1K-2K documents; not multikey or kv); this script's run of them learned
# nothing, so it is not yet reliable (bench/results/2026-12-08-cpu-proxy-passkey.md).
#
#   bash bench/studies/accuracy_proxy.sh                    # ~30 min training on 2 ranks + evaluations
#   ACC_STEPS="100 200 120 40" bash bench/studies/accuracy_proxy.sh   # shorter (copy, copy2, short, long step counts)
#
# Resumable like bench/gpu/accuracy.sh (ACC_BUDGET_S / ACC_DEADLINE, the same command again continues).
# Env: SB, ACC_RUNS (runs/accuracy_proxy), PROXY_K ("4 8": the budgets diagnosed), PROXY_DIAG_DOCS (48),
# and bench/gpu/accuracy.sh's. Writes $ACC_RUNS/diagnose_k<K>.json and diagnose.md beside its files.
set -uo pipefail
export ACC_SCALE=proxy
export ACC_NP=${ACC_NP:-2}  # one rank a core of the 2-core machine it was sized for (accuracy.sh sets up mpirun)
SB=${SB:-build/src/sparsebalance}
RUNS=${ACC_RUNS:-runs/accuracy_proxy}
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
mkdir -p "$RUNS"
SB=$SB ACC_RUNS=$RUNS bash bench/gpu/accuracy.sh 2>&1 | tee "$RUNS/proxy.log"
tail -1 "$RUNS/proxy.log" | grep -q "accuracy: done" || { echo "accuracy_proxy.sh: training not finished (run again)"; exit 0; }
CK=$(cat "$RUNS/final_long")
MICRO=$(grep -E '^micro_batch_tokens' configs/accuracy_proxy.toml | sed -E 's/[^=]*= *([0-9]+).*/\1/')
: > "$RUNS/diagnose.md"
for K in ${PROXY_K:-4 8}; do
  js=$RUNS/diagnose_k$K.json
  if [ ! -f "$js" ]; then
    "$SB" eval --checkpoint "$CK" --set data.path="$RUNS/data_eval" --set data.val_fraction=0.9 \
      --set train.micro_batch_tokens="$MICRO" --set eval.docs="${PROXY_DIAG_DOCS:-48}" --set attention.k="$K" \
      --diagnose "$js.tmp" > "$RUNS/diagnose_k$K.log" 2>&1 && mv "$js.tmp" "$js" ||
      { echo "accuracy_proxy.sh: eval --diagnose failed:"; tail -5 "$RUNS/diagnose_k$K.log"; exit 1; }
  fi
  { echo "### k0 = $K"; echo; "$PY" bench/analysis/diagnose_table.py "$js"; echo; } >> "$RUNS/diagnose.md"
done
cat "$RUNS/diagnose.md"
