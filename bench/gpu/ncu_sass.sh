#!/usr/bin/env bash
# On the GPU machine, after jobs/gpu/build_on_gpu.sh built build-gpu: one launch of one wgmma attention
# kernel under Nsight Compute with source counters, exported per SASS instruction (executed count and
# warp-stall samples: $OUT/sass_$KERNEL.csv, the report $OUT/$KERNEL.ncu-rep), then
# bench/gpu/sass_mix.py on it: the instruction mix by opcode and the top stall sites. What it is for:
# a kernel bound by its issue rate (ncu_attention.sh shows that) loses to instructions around its
# products; this says which. KERNEL (default bwd_sm90_kernel), L / DENS (default 16384 / 1),
# BENCH_ARGS (more bench_attention_cuda flags, e.g. the Qwen2.5-0.5B shape:
# BENCH_ARGS="--heads 14 --kv-heads 2 --dim 64"), PER (sass_mix.py --per: e.g. the number of
# warp x tile iterations, for instructions per warp per tile).
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
O=${OUT:-gpu-out}
K=${KERNEL:-bwd_sm90_kernel}
L=${L:-16384}
DENS=${DENS:-1}
mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$NCU" ] || { echo "ncu_sass: no ncu on this machine"; exit 2; }
rm -f "$O/$K.ncu-rep"
timeout 240 "$NCU" --kernel-name regex:"$K" --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section InstructionStats --import-source no -o "$O/$K" \
  "$B/kernels/bench_attention_cuda" --lens "$L" --densities "$DENS" --reps 1 --kernels wgmma ${BENCH_ARGS:-} \
  > "$O/ncu_sass_$K.log" 2>&1 || { echo "ncu_sass: ncu failed"; tail -5 "$O/ncu_sass_$K.log"; exit 1; }
timeout 120 "$NCU" -i "$O/$K.ncu-rep" --page source --csv --print-source sass > "$O/sass_$K.csv" 2>&1 \
  || { echo "ncu_sass: export failed"; head -5 "$O/sass_$K.csv"; exit 1; }
python3 "$(dirname "$0")/sass_mix.py" "$O/sass_$K.csv" --per "${PER:-1}"
