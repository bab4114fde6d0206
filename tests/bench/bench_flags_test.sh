#!/usr/bin/env bash
# The bench programs refuse a bad flag (bench/cpp/bench_flags.hpp): a value that is not a number in
# range, a flag without its value, an unknown flag, and bench_checkpoint's unknown mode or LAYERS
# each stop the program with exit 2 and a line naming the flag, the text and what is expected,
# before anything is timed or written. A good command line gets past the parsing: bench_cp_exchange
# runs at one rank (exit 0); the CUDA benches exit 77 without a GPU, 0 with one (a tiny run).
# The checks precede opening the device, so this runs on any machine.
# usage: tests/bench/bench_flags_test.sh SCRATCH [attention=BIN] [fused=BIN] [cp=BIN] [checkpoint=BIN]
set -uo pipefail
D=${1:?usage: bench_flags_test.sh SCRATCH [attention=BIN] [fused=BIN] [cp=BIN] [checkpoint=BIN]}
shift
mkdir -p "$D"
fail() { echo "FAIL: $*"; exit 1; }
n=0
# refused BIN "message" ARGS...: exit 2 and the message, word for word, on stderr
refused() {
  local bin=$1 msg=$2; shift 2
  "$bin" "$@" > "$D/out.txt" 2> "$D/err.txt"
  local rc=$?
  [ "$rc" = 2 ] || { cat "$D/out.txt" "$D/err.txt"; fail "$(basename "$bin") $*: exit $rc, expected 2"; }
  grep -qxF -- "$msg" "$D/err.txt" || { cat "$D/err.txt"; fail "$(basename "$bin") $*: expected the line: $msg"; }
  n=$((n + 1))
}
# accepted BIN CODES ARGS...: exits with one of CODES (e.g. "0 77")
accepted() {
  local bin=$1 codes=$2; shift 2
  "$bin" "$@" > "$D/out.txt" 2>&1
  local rc=$?
  case " $codes " in *" $rc "*) ;; *) cat "$D/out.txt"; fail "$(basename "$bin") $*: exit $rc, expected one of $codes" ;; esac
  n=$((n + 1))
}
for kv in "$@"; do
  k=${kv%%=*} bin=${kv#*=}
  [ -x "$bin" ] || fail "$k: $bin is not an executable"
  case $k in
    attention)
      p=bench_attention_cuda
      refused "$bin" "$p: --lens 1024,2x: expected comma-separated whole numbers >= 1" --lens 1024,2x
      refused "$bin" "$p: --lens ,: expected comma-separated whole numbers >= 1" --lens ,
      refused "$bin" "$p: --densities 1,0: expected comma-separated numbers > 0 and <= 1" --densities 1,0
      refused "$bin" "$p: --densities 0.5,1.5: expected comma-separated numbers > 0 and <= 1" --densities 0.5,1.5
      refused "$bin" "$p: --heads abc: expected a whole number >= 1 and <= 1024" --heads abc
      refused "$bin" "$p: --reps 0: expected a whole number >= 1" --lens 1024 --reps 0
      refused "$bin" "$p: --split 2: expected a whole number >= 0 and <= 1" --split 2
      refused "$bin" "$p: --power needs a value" --lens 1024 --power
      refused "$bin" "$p: unknown flag --len (its flags are listed at the top of its source file)" --len 1024
      refused "$bin" "$p: --order 'Heads': expected mixed, heads or blocks" --order Heads
      refused "$bin" "$p: --bwd-grid 'none': expected compact or full" --bwd-grid none
      refused "$bin" "$p: --bwd-chunk -2: expected a whole number >= -1" --bwd-chunk -2
      accepted "$bin" "0 77" --lens 1024 --densities 1,0.5 --reps 1 --split 0 --power 0 --seed 5
      accepted "$bin" "0 77" --lens 1024 --densities 1 --reps 1 --order heads --bwd-grid full --bwd-chunk 0
      ;;
    fused)
      p=bench_fused_cuda
      refused "$bin" "$p: --tokens -1: expected a whole number >= 1" --tokens -1
      refused "$bin" "$p: --reps 3.5: expected a whole number >= 1" --reps 3.5
      refused "$bin" "$p: --head-dim needs a value" --bias --head-dim
      refused "$bin" "$p: unknown flag --dim (its flags are listed at the top of its source file)" --dim 64
      accepted "$bin" "0 77" --tokens 512 --reps 1 --bias
      ;;
    cp)
      p=bench_cp_exchange
      refused "$bin" "$p: --len 12x: expected a whole number >= 1" --len 12x
      refused "$bin" "$p: --density 0: expected a number > 0 and <= 1" --density 0
      refused "$bin" "$p: --shared -1: expected a number >= 0" --shared -1
      refused "$bin" "$p: --reps needs a value" --reps
      refused "$bin" "$p: unknown flag --seq (its flags are listed at the top of its source file)" --seq 1024
      accepted "$bin" "0" --len 1024 --density 0.25 --reps 1
      grep -q "^sparse density" "$D/out.txt" || { cat "$D/out.txt"; fail "$p: no sparse line"; }
      ;;
    checkpoint)
      p=bench_checkpoint
      refused "$bin" "$p: mode stramp: expected plain, collective, stream, read-whole, read-slice or verify" stramp "$D/ck"
      refused "$bin" "$p: LAYERS 2a: expected a whole number >= 1" stream "$D/ck" 2a
      refused "$bin" "$p: LAYERS 0: expected a whole number >= 1" stream "$D/ck" 0
      refused "$bin" "$p: unexpected argument extra" stream "$D/ck" 2 extra
      if [ -e "$D/ck" ] && [ -n "$(ls -A "$D/ck")" ]; then fail "$p: a refused command line wrote into $D/ck"; fi
      ;;
    *) fail "unknown program key $k (expected attention, fused, cp or checkpoint)" ;;
  esac
done
[ "$n" -gt 0 ] || fail "no program given"
echo "PASS ($n command lines)"
