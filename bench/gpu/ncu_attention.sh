#!/usr/bin/env bash
# On the GPU machine, after jobs/gpu/build_on_gpu.sh built build-gpu: Nsight Compute on one launch of
# each wgmma attention kernel (forward, backward) at L tokens / density (default 16384 / 1): speed of
# light, tensor-pipe use, issue slots and warp stall reasons, as text under $OUT. BENCH_ARGS: more
# bench_attention_cuda flags, e.g. the Qwen2.5-0.5B shape: BENCH_ARGS="--heads 14 --kv-heads 2 --dim 64".
# KERNELS narrows the kernels profiled (default "fwd_sm90_kernel bwd_sm90_kernel").
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
O=${OUT:-gpu-out}
L=${L:-16384}
DENS=${DENS:-1}
mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$NCU" ] || { echo "ncu_attention: no ncu on this machine"; exit 2; }
for k in ${KERNELS:-fwd_sm90_kernel bwd_sm90_kernel}; do
  echo "== $k L=$L density=$DENS"
  timeout 240 "$NCU" --kernel-name regex:"$k" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    "$B/kernels/bench_attention_cuda" --lens "$L" --densities "$DENS" --reps 1 --kernels wgmma ${BENCH_ARGS:-} \
    > "$O/ncu_$k.txt" 2>&1
  grep -vE "^==PROF==|^ +-+ +-+" "$O/ncu_$k.txt" | grep -E "stalled|Throughput|Duration|gmma|pipe_xu|Issue|Eligible|Active Warps|Stall|stall|inst_executed|Warp Cycles|L2 Hit|Mem Busy|Max Bandwidth|Registers|Achieved|wavefronts|Grid Size|Shared Memory" | head -90
done
