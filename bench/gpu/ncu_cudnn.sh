#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on cuDNN's fused attention kernels (PyTorch SDPA, cuDNN
# backend, causal, bf16) forward and backward at L tokens, to read their launch shape (grid, block,
# registers, shared memory), issue and shared-memory load and tensor-pipe use beside our
# bench_attention_cuda's (bench/gpu/ncu_attention.sh). HEADS, KV_HEADS, DIM: the shape (default 32 /
# 32 / 128); text under $OUT.
set -uo pipefail
O=${OUT:-gpu-out}
L=${L:-16384}
mkdir -p "$O"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$NCU" ] || { echo "ncu_cudnn: no ncu on this machine"; exit 2; }
cat > "$O/cudnn_once.py" <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
H, G, D, L = ${HEADS:-32}, ${KV_HEADS:-${HEADS:-32}}, ${DIM:-128}, $L
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v, do = (torch.randn(1, h, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for h in (H, G, G, H))
for t in (q, k, v): t.requires_grad_(True)
for _ in range(2):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G != H)
    torch.autograd.grad(o, (q, k, v), do)
torch.cuda.synchronize()
PY
# the second f+b's kernels (the first warms up and builds cuDNN's plans); names printed in full
timeout 300 "$NCU" --kernel-name regex:"(?i)cudnn|sdpa|fmha|flash|attn|fprop|bprop" --launch-skip 0 --launch-count 8 \
  --section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum \
  python3 "$O/cudnn_once.py" > "$O/ncu_cudnn.txt" 2>&1
grep -vE "^==PROF==|^ +-+ +-+" "$O/ncu_cudnn.txt" | grep -E "^  [a-zA-Z_].*\(|Grid Size|Block Size|Registers|Shared Memory Config|Dynamic Shared|Static Shared|Threads|Duration|Throughput|gmma|Issue|Eligible|L2 Hit|Mem Busy|inst_executed|wavefronts|op_shared|Achieved|Waves" | head -150
