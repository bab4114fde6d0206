#!/usr/bin/env bash
# Scaling beyond this machine: `sparsebalance simulate` (the balancer on a modelled cluster, every
# batching x tuning policy side by side, no model run) from 8 to 4096 ranks, for the longalign and
# chatqa2 length presets; then jobs/plots/report_study.py turns the summaries into a Markdown table and
# PNG plots (makespan, imbalance, bubble and plan time against ranks, per policy; speedup).
#
#   bench/studies/scaling/simulate_study.sh [RESULTS_DIR]     (default runs/simulate-study-YYYYmmdd-HHMMSS)
#
#   SB_BIN      the program (default build/src/sparsebalance; SB_BUILD=build)
#   RANKS       rank counts (default "8 16 32 64 128 256 512 1024 2048 4096")
#   PRESETS     length presets (default "longalign chatqa2")
#   MB          micro-batches per rank (default 16)
#   STEPS_<N>   simulated steps at N ranks (defaults: 20 up to 64 ranks, then 8, 4, 3, 2, 1, 1, 1
#               for 128..4096; a 4096-rank step takes ~1 s unloaded, over a minute on a busy 2-core box)
#   SB_SET      extra overrides, space-separated ("balance.max_change=0.3 simulate.noise=0.05")
#   POLICIES    report: "ablation" (the four of the ablation) or a comma list (default: all eight)
# Output: RESULTS/<preset>-r<N>.json (simulate --summary), .txt (its table), study.json, report.md,
# simulate_<preset>.png, simulate_<preset>_speedup.png. Needs /usr/bin/python3 with matplotlib.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SB_BUILD=${SB_BUILD:-build}
BIN=${SB_BIN:-$SB_BUILD/src/sparsebalance}
[ -x "$BIN" ] || { echo "simulate_study.sh: $BIN not found (build the sparsebalance target, or set SB_BIN)" >&2; exit 1; }
RANKS=${RANKS:-8 16 32 64 128 256 512 1024 2048 4096}
PRESETS=${PRESETS:-longalign chatqa2}
MB=${MB:-16}
RES=${1:-runs/simulate-study-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$RES"
default_steps() {
  local n=$1
  if [ "$n" -le 64 ]; then echo 20; elif [ "$n" -le 128 ]; then echo 8; elif [ "$n" -le 256 ]; then echo 4
  elif [ "$n" -le 512 ]; then echo 3; elif [ "$n" -le 1024 ]; then echo 2; else echo 1; fi
}
sets=()
for kv in ${SB_SET:-}; do sets+=(--set "$kv"); done
points=()
t_all=$(date +%s)
for P in $PRESETS; do
  for N in $RANKS; do
    v=STEPS_$N
    S=${!v:-$(default_steps "$N")}
    t0=$(date +%s%N)
    "$BIN" simulate --set simulate.ranks="$N" --set simulate.micro_batches="$MB" --set simulate.preset="$P" \
      --set simulate.steps="$S" "${sets[@]}" --summary "$RES/$P-r$N.json" > "$RES/$P-r$N.txt"
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    dt=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
    printf 'simulate_study: %-9s %5d ranks x %d micro-batches, %2d steps: %6.1f s\n' "$P" "$N" "$MB" "$S" "$dt" >&2
    points+=("{\"name\": \"$P-r$N\", \"preset\": \"$P\", \"ranks\": $N, \"steps\": $S, \"seconds\": $dt, \"summary\": \"$P-r$N.json\"}")
  done
done
machine="$(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
pts=$(IFS=,; echo "${points[*]}")
cat > "$RES/study.json" <<JSON
{"kind": "simulate", "micro_batches": $MB, "presets": "$PRESETS", "set": "${SB_SET:-}",
 "submitted": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(hostname -s)", "machine": "$machine",
 "seconds": $(( $(date +%s) - t_all )), "command": "$0 $*",
 "points": [$pts]}
JSON
/usr/bin/python3 "$ROOT/jobs/plots/report_study.py" "$RES" --wide ${POLICIES:+--policies "$POLICIES"}
echo "simulate_study: $RES ($(( $(date +%s) - t_all )) s)" >&2
