#!/usr/bin/env bash
# Documents in parts in `simulate` (issue 21): longalign up to 256K, 64K-token micro-batches, every
# rank count in RANKS x 1 and 4 micro-batches, for each splitting setting; one Markdown row per run
# against the token-level bound (total work / ranks at k0) and the bounds split plans add to it
# (src/balance/README.md, "Documents in parts"; bench/results/2026-12-01-parts-in-simulate.md).
# usage: bench/studies/simulate_parts_table.sh [BIN] [label]   env: RANKS ("64 256 1024"), STEPS (2),
#   SETS (more simulate arguments, e.g. "--set train.device=cuda": the members gate the whole document)
set -euo pipefail
BIN=${1:-build/src/sparsebalance}
LABEL=${2:-}
[ -x "$BIN" ] || { echo "simulate_parts_table.sh: $BIN not found (build the sparsebalance target first)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for R in ${RANKS:-64 256 1024}; do for M in 1 4; do
  for cfg in "split" "split_docs 0.2" "split_docs 0.1"; do
    set -- $cfg
    X=()
    [ "$1" = split_docs ] && X=(--set balance.split_docs=true --set balance.part_share=$2)
    f="$TMP/r$R-m$M-${cfg// /_}.json"
    "$BIN" simulate --set simulate.ranks=$R --set simulate.micro_batches=$M --set simulate.max_len=262144 \
      --set simulate.steps=${STEPS:-2} --set simulate.long_docs=split "${X[@]}" ${SETS:-} --summary "$f" > /dev/null
    echo "$R $M ${cfg// /_} $f" >> "$TMP/list"
  done
done; done
/usr/bin/python3 - "$TMP/list" "$LABEL" <<'PY'
import json, sys
rows = [l.split() for l in open(sys.argv[1])]
label = sys.argv[2]
for r, m, cfg, f in rows:
    j = json.load(open(f))
    fx, dst = j["policies"]["sparse+fixed"], j["policies"]["sparse+dst"]
    tb = j["token_bound_k0"]
    cfg = "split" if cfg == "split" else "split_docs, part_share " + cfg.split("_")[-1]
    floor = j.get("token_bound_k0_floor")
    print(f"| {label} | {r} x {m} | {cfg} | {fx['makespan']/1e3:.2f} | {fx['imbalance']:.3f} | {dst['makespan']/1e3:.2f} | "
          f"{dst['plan_ms']:.2f} | {tb/1e3:.2f} | {j['token_bound_k0_exchange']/1e3:.2f} | "
          f"{'-' if floor is None else f'{floor/1e3:.2f}'} | {j['whole_doc_bound']/1e3:.2f} | "
          f"{fx['makespan']/tb:.3f} | {dst['makespan']/tb:.3f} | "
          f"{fx.get('part_exchange_ms', float('nan'))/tb*100:.1f} | {fx.get('part_split_extra_ms', float('nan'))/tb*100:.1f} |")
PY
