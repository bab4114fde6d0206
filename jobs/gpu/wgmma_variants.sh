#!/usr/bin/env bash
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh has built build-gpu (any stage): the wgmma
# backward's dQ accumulation variants side by side. The default (staged in shared memory, float4
# atomics overlapping the next tile's first products), SB_ATTN_BWD_VARIANT=1 (float2 atomics from
# registers, not overlapped) and =2 (staged, one bulk reduce-add per row by the TMA engine): the
# kernel test under 1 and 2 (the default is tested by the `test` stage), then the three timed in
# one process each, alternating, at LENS. Logs and CSVs under $OUT. BENCH_ARGS: more
# bench_attention_cuda flags, e.g. the Qwen2.5-0.5B shape: BENCH_ARGS="--heads 14 --kv-heads 2 --dim 64".
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
O=${OUT:-gpu-out}
LENS=${LENS:-8192,16384,32768}
mkdir -p "$O"
for v in 1 2; do
  echo "== SB_ATTN_BWD_VARIANT=$v: kernel test"
  SB_ATTN_BWD_VARIANT=$v timeout 90 "$B/tests/cuda/test_attention_cuda" > "$O/test_v$v.log" 2>&1
  grep -E "FAIL|PASSED" "$O/test_v$v.log"
done
for v in 0 1 2; do
  echo "== bench SB_ATTN_BWD_VARIANT=$v"
  SB_ATTN_BWD_VARIANT=$v timeout 150 "$B/kernels/bench_attention_cuda" --lens "$LENS" --kernels wgmma ${BENCH_ARGS:-} --csv "$O/v$v.csv" > "$O/v$v.log" 2>&1
done
python3 - "$O" <<'PY'
import csv, sys
o = sys.argv[1]
a, b, c = (list(csv.DictReader(open(f"{o}/v{v}.csv"))) for v in (0, 1, 2))
print("      L  dens  bwd ms default  v1 (float2)  v2 (bulk)  v1/default  v2/default")
for x, y, z in zip(a, b, c):
    d = float(x["bwd_ms"])
    print(f"{x['L']:>7} {x['density']:>5} {d:14.3f} {float(y['bwd_ms']):12.3f} {float(z['bwd_ms']):10.3f}"
          f" {float(y['bwd_ms']) / d:11.3f} {float(z['bwd_ms']) / d:11.3f}")
PY
