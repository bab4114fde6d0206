#!/usr/bin/env bash
# Where DST pays for speed: the DST-alone speedup (sequential+dst over sequential+fixed, both from
# one `sparsebalance simulate` run) against the attention share of a step, for balance.max_change
# 0.1/0.2/0.3 and several rank counts. The attention share is set two ways:
#   - coefficients: the analytic model's simulate.attn_ps_per_pair scaled (token-linear work fixed),
#   - model shape: simulate.block_size 32..512 (attention per token grows with k0 x Bs; default coefficients).
# (Document length alone hardly moves it: at a fixed budget k0 the kept pairs grow linearly with the
# length, like the token-linear work.)
# simulate reports the share itself (attention / total of one max_len document at k0); that is the
# x axis. Prints Markdown tables; writes bench/figures/dst_share_sweep.png and the raw JSON lines.
# usage: bench/studies/dst_share_sweep.sh [BUILD_DIR] [extra --set key=value ...]
#   env: RANKS ("2 8 64"), CHANGES ("0.1 0.2 0.3"), STEPS (10), MB (16), PRESET (longalign),
#        OUT (bench/figures/dst_share_sweep) -> OUT.png, OUT.jsonl
set -euo pipefail
BUILD=${1:-build}
shift || true
BIN="$BUILD/src/sparsebalance"
[ -x "$BIN" ] || { echo "dst_share_sweep.sh: $BIN not found (build the sparsebalance target first)" >&2; exit 1; }
RANKS=${RANKS:-"2 8 64"}
CHANGES=${CHANGES:-"0.1 0.2 0.3"}
STEPS=${STEPS:-10}
MB=${MB:-16}
PRESET=${PRESET:-longalign}
OUT=${OUT:-bench/figures/dst_share_sweep}
# attn_ps_per_pair values: the default 560 gives ~49% at 64K tokens, 32 layers, k0 32.
COEFFS=${COEFFS:-"120 200 300 420 560 800 1200 1900 3000"}
BLOCKS=${BLOCKS:-"32 64 128 256 512"}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
: > "$TMP/all.jsonl"

one() {  # one() AXIS VALUE RANKS CHANGE --set ...
  local axis=$1 value=$2 r=$3 c=$4
  shift 4
  "$BIN" simulate --set simulate.ranks="$r" --set simulate.micro_batches="$MB" --set simulate.preset="$PRESET" \
    --set simulate.steps="$STEPS" --set balance.max_change="$c" "$@" "${EXTRA[@]}" --summary "$TMP/s.json" > /dev/null
  /usr/bin/python3 - "$TMP/s.json" "$axis" "$value" "$r" "$c" >> "$TMP/all.jsonl" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p = j["policies"]
print(json.dumps({"axis": sys.argv[2], "value": float(sys.argv[3]), "ranks": int(sys.argv[4]), "max_change": float(sys.argv[5]),
                  "share": j["attention_share"], "dst_speedup": p["sequential+dst"]["speedup"],
                  "bubble_fixed": p["sequential+fixed"]["bubble"], "bubble_dst": p["sequential+dst"]["bubble"],
                  "recall_fixed": p["sequential+fixed"]["recall"], "recall_dst": p["sequential+dst"]["recall"],
                  "sab_speedup": p["sparse+fixed"]["speedup"], "sab_dst_speedup": p["sparse+dst"]["speedup"]}))
PY
}

EXTRA=("$@")
for r in $RANKS; do
  for c in $CHANGES; do
    for a in $COEFFS; do one coeff "$a" "$r" "$c" --set simulate.attn_ps_per_pair="$a"; done
    for b in $BLOCKS; do one shape "$b" "$r" "$c" --set simulate.block_size="$b"; done
  done
done
mkdir -p "$(dirname "$OUT")"
cp "$TMP/all.jsonl" "$OUT.jsonl"

/usr/bin/python3 - "$OUT" "$RANKS" "$CHANGES" <<'PY'
import json, sys
out, ranks, changes = sys.argv[1], [int(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
rows = [json.loads(l) for l in open(out + ".jsonl")]
for axis, label in (("coeff", "attn_ps_per_pair"), ("shape", "block_size")):
    sub = [r for r in rows if r["axis"] == axis]
    vals = sorted({r["value"] for r in sub})
    print(f"\nDST-alone speedup (sequential+dst / sequential+fixed), share set by {label}; "
          f"columns: ranks / max_change\n")
    cols = [(r, c) for r in ranks for c in changes]
    print(f"| {label} | attention share | " + " | ".join(f"{r} / {c:g}" for r, c in cols) + " |")
    print("|---:|---:|" + "---:|" * len(cols))
    for v in vals:
        at = {(r["ranks"], r["max_change"]): r for r in sub if r["value"] == v}
        share = next(iter(at.values()))["share"]
        print(f"| {v:g} | {100*share:.0f}% | " + " | ".join(f"{at[k]['dst_speedup']:.3f}" for k in cols) + " |")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, axes = plt.subplots(1, len(changes), figsize=(4.2 * len(changes), 3.6), sharey=True)
axes = axes if len(changes) > 1 else [axes]
for ax, c in zip(axes, changes):
    for r in ranks:
        for axis, mark, ls in (("coeff", "o", "-"), ("shape", "s", ":")):
            pts = sorted((x["share"], x["dst_speedup"]) for x in rows
                         if x["ranks"] == r and x["max_change"] == c and x["axis"] == axis)
            ax.plot([100 * p[0] for p in pts], [p[1] for p in pts], marker=mark, ls=ls, ms=4,
                    label=f"{r} ranks ({'coefficient' if axis == 'coeff' else 'block size'})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_title(f"balance.max_change = {c:g}")
    ax.set_xlabel("attention share of a step (%)")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("DST-alone speedup (sequential+dst / +fixed)")
axes[-1].legend(fontsize=7)
fig.tight_layout()
fig.savefig(out + ".png", dpi=120)
print(f"\nplot: {out}.png, points: {out}.jsonl")
PY
