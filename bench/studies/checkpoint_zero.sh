#!/bin/bash
# Checkpoint write time and peak host memory, today's writer (plain) against train.zero = 1's
# sliced writers (collective, stream), configs/gpu_0p5b.toml shape, 1 and 2 ranks, one run at a
# time. Figures: bench/results/2026-12-01-checkpoint-writers.md, -readers.md. Needs ~12 GiB free memory and ~6 GB of disk in OUT.
# The resume readers too: MODES "read-whole read-slice" (read-whole at 24 layers and 2 ranks needs
# ~19 GiB). RANKS (default "1 2") picks the rank counts.
#   [RANKS="2"] bench/studies/checkpoint_zero.sh [OUT_DIR] [LAYERS] [MODES]   (MODES default "plain collective stream")
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/sb_bench_ckpt}
layers=${2:-24}
modes=${3:-plain collective stream}
mkdir -p "$out"
bin=build/bench/bench_checkpoint
cmake --build build --target bench_checkpoint >/dev/null
echo "commit $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for ranks in ${RANKS:-1 2}; do
  for mode in $modes; do
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" -x OPENBLAS_NUM_THREADS=1 "$bin" "$mode" "$out" "$layers"
  done
done
