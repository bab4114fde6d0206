#!/usr/bin/env bash
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh has built build-gpu (any stage): the wgmma
# backward's dQ accumulation, the default (staged in shared memory, float4 atomics overlapping the
# next tile) against SB_ATTN_BWD_VARIANT=1 (float2 atomics from registers, not overlapped): the
# kernel test under variant 1, then both timed side by side at 8K-32K (the default was tested by
# the `test` stage). Logs and CSVs under $OUT.
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
O=${OUT:-gpu-out}
LENS=${LENS:-8192,16384,32768}
mkdir -p "$O"
echo "== SB_ATTN_BWD_VARIANT=1: kernel test"
SB_ATTN_BWD_VARIANT=1 timeout 60 "$B/tests/cuda/test_attention_cuda" > "$O/test_v1.log" 2>&1
grep -E "FAIL|PASSED" "$O/test_v1.log"
echo "== bench default (staged dQ, float4, overlapped)"
timeout 120 "$B/kernels/bench_attention_cuda" --lens "$LENS" --kernels wgmma --csv "$O/v0.csv"
echo "== bench SB_ATTN_BWD_VARIANT=1 (float2 from registers)"
SB_ATTN_BWD_VARIANT=1 timeout 120 "$B/kernels/bench_attention_cuda" --lens "$LENS" --kernels wgmma --csv "$O/v1.csv"
python3 - "$O/v0.csv" "$O/v1.csv" <<'PY'
import csv, sys
a = list(csv.DictReader(open(sys.argv[1]))); b = list(csv.DictReader(open(sys.argv[2])))
print(" L      dens  bwd ms default  bwd ms v1  v1/default")
for x, y in zip(a, b):
    print(f"{x['L']:>6} {x['density']:>5} {float(x['bwd_ms']):14.3f} {float(y['bwd_ms']):10.3f} {float(y['bwd_ms']) / float(x['bwd_ms']):11.3f}")
PY
