#!/usr/bin/env bash
# Build and run one libFuzzer target (or all) for SECONDS each.
#   tests/fuzz/run_fuzz.sh [--no-build] config|shard|checkpoint|all SECONDS [libFuzzer flags...]
# Build dir: $SB_FUZZ_BUILD (default build-fuzz at the repo root), configured with clang and
# SB_FUZZ=ON. Corpus (kept between runs): $SB_FUZZ_BUILD/fuzz-corpus/TARGET, seeded with small
# valid files from fuzz_seeds. Crashing inputs: $SB_FUZZ_BUILD/fuzz-artifacts/TARGET/.
#
# libFuzzer runs in fork mode and keeps going after a crash, so one run reports every crash it
# finds. Each crashing input is re-run and triaged by its stack: the first frame in our code or
# in libhdf5 decides. Crashes in our code fail the run (exit 1). Crashes, hangs and huge
# allocations whose first such frame is inside libhdf5 (HDF5 1.10 trusts sizes in hostile files,
# e.g. global-heap objects of variable-length strings) are listed as HDF5-INTERNAL and fail the
# run only with SB_FUZZ_STRICT=1. CI: `tests/fuzz/run_fuzz.sh all 20`.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${SB_FUZZ_BUILD:-$ROOT/build-fuzz}
build=1
if [[ ${1:-} == --no-build ]]; then build=0; shift; fi
TARGET=${1:?usage: run_fuzz.sh [--no-build] config|shard|checkpoint|all SECONDS [libFuzzer flags]}
SECONDS_EACH=${2:?seconds}
shift 2
if [[ $TARGET == all ]]; then targets=(config shard checkpoint); else targets=("$TARGET"); fi
if (( build )); then
  if [[ ! -f $BUILD/build.ninja ]]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
      -DCMAKE_CXX_COMPILER=clang++ -DSB_FUZZ=ON -DSB_BENCH=OFF -DSB_CUDA=OFF >/dev/null || exit 2
  fi
  ninja -C "$BUILD" -j"${SB_FUZZ_JOBS:-1}" fuzz_seeds "${targets[@]/#/fuzz_}" || exit 2
fi
SEEDS=$BUILD/fuzz-seeds
[[ -d $SEEDS/shard ]] || "$BUILD/tests/fuzz/fuzz_seeds" "$SEEDS" || exit 2
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${targets[@]}"; do
  corpus=$BUILD/fuzz-corpus/$t art=$BUILD/fuzz-artifacts/$t
  mkdir -p "$corpus" "$art"
  maxlen=32768; [[ $t == config ]] && maxlen=8192
  log=$BUILD/fuzz-$t.log
  before=$(ls "$art" | wc -l)
  echo "== fuzz_$t for ${SECONDS_EACH}s (corpus $corpus, log $log)"
  "$BUILD/tests/fuzz/fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$SECONDS_EACH" -print_final_stats=1 -max_len=$maxlen -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -timeout=10 -artifact_prefix="$art/" "$@" "$corpus" "$SEEDS/$t" >"$log" 2>&1
  runs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  echo "fuzz_$t: about ${runs:-?} inputs run; $(( $(ls "$art" | wc -l) - before )) new crashing inputs"
  ours=0 hdf5=0
  for f in $(ls -t "$art" | head -n $(( $(ls "$art" | wc -l) - before ))); do
    out=$(timeout 30 "$BUILD/tests/fuzz/fuzz_$t" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 "$art/$f" 2>&1)
    if ! grep -qE 'ERROR|SUMMARY|deadly signal|HDF5 ids left' <<<"$out"; then continue; fi  # flaky: no longer reproduces
    first=$(grep -E '^ *#[0-9]+ ' <<<"$out" | grep -E 'libhdf5|\.(cpp|hpp):[0-9]+' | grep -vE 'include/c\+\+|compiler-rt|libfuzzer' | head -1)
    if grep -q libhdf5 <<<"$first"; then
      hdf5=$((hdf5 + 1)); echo "  HDF5-INTERNAL $f: $(grep -m1 -oE 'ERROR: [A-Za-z]+: [a-z-]+|timeout|out-of-memory' <<<"$out") at$(grep -oE ' in [A-Za-z0-9_]+' <<<"$first")"
    else
      ours=$((ours + 1)); echo "  OURS $f:"; grep -E 'ERROR|SUMMARY|\.(cpp|hpp):[0-9]+' <<<"$out" | head -8
    fi
  done
  echo "fuzz_$t: $ours crashes in SparseBalance code, $hdf5 inside libhdf5"
  (( ours > 0 )) && status=1
  (( hdf5 > 0 )) && [[ ${SB_FUZZ_STRICT:-0} == 1 ]] && status=1
done
rm -f /dev/shm/sb_fuzz_* /tmp/sb_fuzz_*.h5
exit $status
