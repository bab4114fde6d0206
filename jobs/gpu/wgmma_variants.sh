#!/usr/bin/env bash
# Run on the GPU machine after jobs/gpu/build_on_gpu.sh has built build-gpu (any stage): the wgmma
# backward's variants side by side. The default (dQ staged in shared memory, one bulk reduce-add
# a warpgroup's tile into the tiled workspace; head_dim 64 in 128-query tiles with dQ split by
# queries), SB_ATTN_BWD_VARIANT=7 (the same tiles, staged dQ added by float4 atomics overlapping
# the next tile's first products), =1 (float2 atomics from registers, not overlapped), =2 (staged,
# one bulk reduce-add per row), =5 (head_dim 64 in 64-query tiles, float4 atomics), =6 (head_dim 64
# in 128-query tiles with dQ split by keys), =8 (the default's tiles with dQ waited for and staged
# right after its product, no product in flight: the order before the deferred dQ): the kernel
# test under each; =9 (the default without the head split: split columns in item-major chunks,
# across the group's heads with GQA, the order before it)
# (the default is tested by the `test` stage), then all timed in one process each, one after
# another, at LENS. Logs and CSVs under $OUT. VARIANTS (default "1 2") picks them.
# BENCH_ARGS: more bench_attention_cuda flags, e.g. the Qwen2.5-0.5B shape:
# BENCH_ARGS="--heads 14 --kv-heads 2 --dim 64".
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
O=${OUT:-gpu-out}
LENS=${LENS:-8192,16384,32768}
VARIANTS=${VARIANTS:-1 2}
mkdir -p "$O"
for v in $VARIANTS; do
  echo "== SB_ATTN_BWD_VARIANT=$v: kernel test"
  SB_ATTN_BWD_VARIANT=$v timeout 90 "$B/tests/cuda/test_attention_cuda" > "$O/test_v$v.log" 2>&1
  grep -E "FAIL|PASSED" "$O/test_v$v.log"
done
for v in 0 $VARIANTS; do
  echo "== bench SB_ATTN_BWD_VARIANT=$v"
  SB_ATTN_BWD_VARIANT=$v timeout 150 "$B/kernels/bench_attention_cuda" --lens "$LENS" --kernels wgmma ${BENCH_ARGS:-} --csv "$O/v$v.csv" > "$O/v$v.log" 2>&1
done
python3 - "$O" 0 $VARIANTS <<'PY'
import csv, sys
o, vs = sys.argv[1], sys.argv[2:]
t = {v: list(csv.DictReader(open(f"{o}/v{v}.csv"))) for v in vs}
print("      L  dens  bwd ms default" + "".join(f"  v{v} ms  v{v}/default" for v in vs[1:]))
for i, x in enumerate(t["0"]):
    d = float(x["bwd_ms"])
    print(f"{x['L']:>7} {x['density']:>5} {d:14.3f}" +
          "".join(f" {float(t[v][i]['bwd_ms']):7.3f} {float(t[v][i]['bwd_ms']) / d:12.3f}" for v in vs[1:]))
PY
