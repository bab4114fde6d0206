#!/usr/bin/env bash
# Build and run one libFuzzer target (or all) for SECONDS each.
#   tests/fuzz/run_fuzz.sh [--no-build] config|shard|checkpoint|all SECONDS [libFuzzer flags...]
# Build dir: $SB_FUZZ_BUILD (default build-fuzz at the repo root), configured with clang and
# SB_FUZZ=ON. Corpus (kept between runs): $SB_FUZZ_BUILD/fuzz-corpus/TARGET, seeded with small
# valid files from fuzz_seeds. Crashing inputs: $SB_FUZZ_BUILD/fuzz-artifacts/TARGET/.
#
# libFuzzer runs in fork mode and keeps going after a crash, so one run reports every crash it
# finds. Each crashing input is re-run and triaged by its stack: the first frame in our code or
# in libhdf5 decides; re-runs go $(nproc) at a time. Crashes in our code fail the run (exit 1).
# Crashes, hangs and huge allocations whose first such frame is inside libhdf5 (HDF5 1.10 trusts
# sizes in hostile files, e.g. global-heap objects of variable-length strings) are listed, one line
# per site, as HDF5-INTERNAL and fail the run only with SB_FUZZ_STRICT=1. The HDF5 targets read
# their inputs as damaged files of this program (seeds with whole-file checksums, checked before
# libhdf5 parses anything), so SB_FUZZ_STRICT=1 passes for them.
# SB_FUZZ_FORK=N runs N fuzzing jobs at once; SB_FUZZ_TRIAGE_MAX=N re-runs a sample of N.
# CI: `tests/fuzz/run_fuzz.sh all 20`.
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
# Seeds carry whole-file checksums (io/file_checksum.hpp); older seed sets are made again.
[[ -f $SEEDS/.checksummed ]] || { rm -rf "$SEEDS" && "$BUILD/tests/fuzz/fuzz_seeds" "$SEEDS" && touch "$SEEDS/.checksummed"; } || exit 2
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
FORK=${SB_FUZZ_FORK:-1}          # parallel fuzzing jobs (libFuzzer -fork=N)
NPROC=$(nproc)
TRIAGE_MAX=${SB_FUZZ_TRIAGE_MAX:-1000000}   # re-run at most this many new crashing inputs

# triage TARGET INPUT: re-run one crashing input; print "OURS|HDF5-INTERNAL|GONE <kind> <site>".
triage() {
  local out first kind site
  out=$(timeout 30 "$BUILD/tests/fuzz/fuzz_$1" -timeout=3 -rss_limit_mb=2048 -malloc_limit_mb=1024 "$2" 2>&1)
  if ! grep -qE 'ERROR|SUMMARY|deadly signal|HDF5 ids left' <<<"$out"; then echo "GONE - - $2"; return; fi
  first=$(grep -E '^ *#[0-9]+ ' <<<"$out" | grep -E 'libhdf5|\.(cpp|hpp):[0-9]+' | grep -vE 'include/c\+\+|compiler-rt|libfuzzer' | head -1)
  if [[ -z $first ]] && grep -q 'out-of-memory (used' <<<"$out"; then
    # An RSS-limit OOM has no stack; a low malloc limit stops at the big allocation instead.
    first=$(timeout 30 "$BUILD/tests/fuzz/fuzz_$1" -timeout=3 -malloc_limit_mb=64 "$2" 2>&1 | grep -E '^ *#[0-9]+ ' |
            grep -E 'libhdf5|\.(cpp|hpp):[0-9]+' | grep -vE 'include/c\+\+|compiler-rt|libfuzzer' | head -1)
  fi
  kind=$(grep -m1 -oE 'ERROR: [A-Za-z]+: [a-z-]+|ERROR: libFuzzer: [a-z-]+|timeout|out-of-memory|HDF5 ids left' <<<"$out" | sed 's/ERROR: //; s/: /:/; s/ /_/g')
  site=$(grep -oE ' in [A-Za-z0-9_:]+' <<<"$first" | head -1 | sed 's/ in //')
  [[ -z $site ]] && site=$(grep -oE '[a-z0-9_]+\.so[.0-9]*\+0x[0-9a-f]+' <<<"$first" | head -1)
  if grep -q libhdf5 <<<"$first"; then echo "HDF5-INTERNAL ${kind:-?} ${site:-?} $2"
  else echo "OURS ${kind:-?} ${site:-?} $2"; grep -E 'ERROR|SUMMARY|\.(cpp|hpp):[0-9]+' <<<"$out" | head -8 | sed 's/^/    /' >&2; fi
}
export -f triage; export BUILD

status=0
for t in "${targets[@]}"; do
  corpus=$BUILD/fuzz-corpus/$t art=$BUILD/fuzz-artifacts/$t
  mkdir -p "$corpus" "$art"
  maxlen=32768; [[ $t == config ]] && maxlen=8192
  log=$BUILD/fuzz-$t.log
  ls "$art" | sort >"$BUILD/.fuzz-before-$t"
  echo "== fuzz_$t for ${SECONDS_EACH}s, $FORK job(s) (corpus $corpus, log $log)"
  "$BUILD/tests/fuzz/fuzz_$t" -fork="$FORK" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$SECONDS_EACH" -print_final_stats=1 -max_len=$maxlen -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -timeout=2 -artifact_prefix="$art/" "$@" "$corpus" "$SEEDS/$t" >"$log" 2>&1
  runs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  mapfile -t new < <(ls "$art" | sort | comm -13 "$BUILD/.fuzz-before-$t" -)
  echo "fuzz_$t: ${runs:-?} inputs run; ${#new[@]} new crashing/hanging inputs"
  if (( ${#new[@]} > TRIAGE_MAX )); then
    echo "fuzz_$t: triaging a random $TRIAGE_MAX of them (SB_FUZZ_TRIAGE_MAX)"
    mapfile -t new < <(printf '%s\n' "${new[@]}" | shuf -n "$TRIAGE_MAX" --random-source=<(yes))
  fi
  res=$(printf '%s\n' "${new[@]/#/$art/}" | grep -v '^$' | xargs -r -P "$NPROC" -I{} bash -c 'triage "$0" "$1"' "$t" {})
  ours=$(grep -c '^OURS' <<<"$res")
  hdf5=$(grep -c '^HDF5-INTERNAL' <<<"$res")
  grep '^OURS' <<<"$res" | sed 's/^/  /'
  # One line per distinct libhdf5 site: how many inputs ended there, and how.
  grep '^HDF5-INTERNAL' <<<"$res" | awk '{print $2, $3}' | sort | uniq -c | sort -rn | sed 's/^/  HDF5-INTERNAL x/'
  echo "fuzz_$t: $ours crashes in SparseBalance code, $hdf5 inside libhdf5, $(grep -c '^GONE' <<<"$res") no longer reproduce"
  (( ours > 0 )) && status=1
  (( hdf5 > 0 )) && [[ ${SB_FUZZ_STRICT:-0} == 1 ]] && status=1
done
rm -f /dev/shm/sb_fuzz_* /tmp/sb_fuzz_*.h5
exit $status
