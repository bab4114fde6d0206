#!/usr/bin/env bash
# bench_attention_cuda --ref takes a bench/torch/flex_attention_ref.py CSV only at the shape it was timed at:
# a GQA CSV against the default (MHA) shape, and an older CSV without the shape columns (MHA, 32
# heads, dim 128) against the Qwen shape, are refused with exit 2 and a message naming both shapes;
# the matching shape gets past the check (then 77 without a GPU, 0 with one: a tiny run). The check
# comes before the device is opened, so this runs on any machine.
# usage: tests/cuda/bench_ref_shape_test.sh BENCH_ATTENTION_CUDA SCRATCH_DIR
set -uo pipefail
BIN=${1:?usage: bench_ref_shape_test.sh BINARY SCRATCH}
D=${2:?usage: bench_ref_shape_test.sh BINARY SCRATCH}
mkdir -p "$D"
fail() { echo "FAIL: $*"; exit 1; }
printf 'L,density,kept_frac,flex_fwdbwd_ms,flex_tflops,cudnn_fwdbwd_ms,heads,kv_heads,dim\n1024,1.0,1.0,0.5,10.0,0.4,14,2,64\n' > "$D/gqa.csv"
printf 'L,density,kept_frac,flex_fwdbwd_ms,flex_tflops,cudnn_fwdbwd_ms\n1024,1.0,1.0,0.5,10.0,0.4\n' > "$D/old.csv"
run() { "$BIN" --lens 1024 --densities 1 --reps 1 "$@" > "$D/out.txt" 2>&1; echo $?; }

rc=$(run --ref "$D/gqa.csv")
[ "$rc" = 2 ] || { cat "$D/out.txt"; fail "GQA CSV against the MHA default: exit $rc, expected 2"; }
grep -q -- "--ref: timed at heads 14, kv_heads 2, dim 64; this run is --heads 32 --kv-heads 32 --dim 128" "$D/out.txt" \
  || { cat "$D/out.txt"; fail "GQA CSV: message"; }

rc=$(run --heads 14 --kv-heads 2 --dim 64 --ref "$D/old.csv")
[ "$rc" = 2 ] || { cat "$D/out.txt"; fail "old CSV against the Qwen shape: exit $rc, expected 2"; }
grep -q -- "--ref: timed at heads 32, kv_heads 32, dim 128; this run is --heads 14 --kv-heads 2 --dim 64" "$D/out.txt" \
  || { cat "$D/out.txt"; fail "old CSV: message"; }

rc=$(run --heads 14 --kv-heads 2 --dim 64 --ref "$D/gqa.csv")
[ "$rc" = 77 ] || [ "$rc" = 0 ] || { cat "$D/out.txt"; fail "matching shape: exit $rc, expected 77 (no GPU) or 0"; }
echo PASS
