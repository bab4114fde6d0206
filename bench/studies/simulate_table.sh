#!/usr/bin/env bash
# Runs `sparsebalance simulate` at 8, 64, 512 and 4096 modelled ranks and prints one Markdown
# table of every batching x tuning policy (see src/balance/README.md, "Simulate").
# usage: bench/studies/simulate_table.sh [BUILD_DIR] [extra --set key=value ...]
#   env: MB (micro-batches per rank, 16), PRESET (longalign), STEPS_8/64/512/4096 (20/10/4/1)
set -euo pipefail
BUILD=${1:-build}
shift || true
BIN="$BUILD/src/sparsebalance"
[ -x "$BIN" ] || { echo "simulate_table.sh: $BIN not found (build the sparsebalance target first)" >&2; exit 1; }
MB=${MB:-16}
PRESET=${PRESET:-longalign}
declare -A STEPS=([8]=${STEPS_8:-20} [64]=${STEPS_64:-10} [512]=${STEPS_512:-4} [4096]=${STEPS_4096:-1})
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for R in 8 64 512 4096; do
  "$BIN" simulate --set simulate.ranks=$R --set simulate.micro_batches=$MB --set simulate.preset=$PRESET \
    --set simulate.steps=${STEPS[$R]} "$@" --summary "$TMP/r$R.json" > "$TMP/r$R.txt"
done
python3 - "$TMP" "$MB" "$PRESET" <<'PY'
import json, sys
tmp, mb, preset = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"preset `{preset}`, {mb} micro-batches per rank; speedup vs sequential+fixed; vs LB = makespan / lower bound;")
print("plan ms = make_plan + T* + one rank's own DST work per step (CPU time; what each real rank pays)\n")
print("| ranks | policy | makespan (s) | imbalance | bubble | recall | speedup | vs LB | plan ms |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for r in (8, 64, 512, 4096):
    j = json.load(open(f"{tmp}/r{r}.json"))
    for name in [f"{b}+{t}" for b in ("sequential", "tokens", "quadratic", "sparse") for t in ("fixed", "dst")]:
        p = j["policies"][name]
        print(f"| {r} | {name} | {p['makespan']/1e3:.2f} | {p['imbalance']:.4f} | {p['bubble']:.4f} | {p['recall']:.4f} | "
              f"{p['speedup']:.3f} | {p['vs_lower_bound']:.4f} | {p['plan_ms']:.2f} |")
    print(f"| {r} | lower bound (k_lo={j['k_lo']}) | {j['lower_bound']/1e3:.2f} | | | | | | |")
PY
