#!/usr/bin/env bash
# On the GPU machine, after jobs/gpu/build_on_gpu.sh built build-gpu from the working tree: builds
# bench_attention_cuda of the baseline tree in .baseline/ (jobs/gpu/make_baseline.sh made it here),
# then times the working tree and the baseline side by side, alternating (ROUNDS times each, the
# median kept), plus the working tree with the benchmark flags ALT (default "--order heads", the
# head-outer CTA order), and prints per point the ratios baseline/new and alt/new of forward,
# backward and f+b time (above 1: the new code is faster). LENS, DENS and BENCH_ARGS (more flags,
# e.g. the Qwen2.5-0.5B shape "--heads 14 --kv-heads 2 --dim 64") pass to the benchmark; CSVs and
# logs under $OUT. E.g. ALT="--bwd-grid full": the backward's full grid beside the compacted one
# (bench_attention_cuda.cu lists the flags).
set -uo pipefail
ROOT=$(pwd)
B=${BUILD_DIR:-$ROOT/build-gpu}
BB=$ROOT/build-base
O=${OUT:-$ROOT/gpu-out}
LENS=${LENS:-8192,16384,32768,65536}
DENS=${DENS:-1,0.5,0.25,0.1}
ROUNDS=${ROUNDS:-2}
ALT=${ALT:---order heads}
mkdir -p "$O/base"
[ -f .baseline/REV ] || { echo "ab_bench: no .baseline/ (run jobs/gpu/make_baseline.sh REV here and carry it)"; exit 2; }
echo "== baseline $(cat .baseline/REV): build"
(cd .baseline && BUILD_DIR=$BB DEBS=$ROOT/.debs OUT=$O/base BUILD_TARGETS=bench_attention_cuda \
  bash "$ROOT/jobs/gpu/build_on_gpu.sh" none) | tail -3
[ -x "$BB/kernels/bench_attention_cuda" ] || { echo "ab_bench: baseline build failed (see $O/base/build.log)"; exit 1; }
run() {  # name binary [flags...]
  local name=$1 bin=$2; shift 2
  timeout 300 "$bin" --lens "$LENS" --densities "$DENS" --kernels wgmma ${BENCH_ARGS:-} "$@" --csv "$O/ab_${name}_$r.csv" \
    > "$O/ab_${name}_$r.log" 2>&1 || echo "ab_bench: $name round $r failed (rc $?)"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  run new "$B/kernels/bench_attention_cuda"
  run base "$BB/kernels/bench_attention_cuda"
  run alt "$B/kernels/bench_attention_cuda" $ALT
done
echo "== alt: $ALT"
python3 - "$O" "$ROUNDS" <<'PY'
import csv, statistics, sys
o, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    runs = [list(csv.DictReader(open(f"{o}/ab_{name}_{r}.csv"))) for r in range(1, rounds + 1)]
    out = {}
    for rows in zip(*runs):
        key = (int(rows[0]["L"]), float(rows[0]["density"]))
        out[key] = {c: statistics.median(float(x[c]) for x in rows) for c in ("fwd_ms", "bwd_ms", "fwdbwd_ms")}
        out[key]["tflops"] = statistics.median(float(x["fwdbwd_tflops"]) for x in rows)
    return out
new, base, alt = load("new"), load("base"), load("alt")
print("      L  dens | new fwd   bwd     f+b   TFLOP/s | base f+b  alt f+b | base/new fwd  bwd   f+b | alt/new bwd  f+b")
for k in new:
    n, b, a = new[k], base[k], alt[k]
    print(f"{k[0]:7d} {k[1]:5.2f} | {n['fwd_ms']:7.3f} {n['bwd_ms']:7.3f} {n['fwdbwd_ms']:8.3f} {n['tflops']:6.1f} |"
          f" {b['fwdbwd_ms']:8.3f} {a['fwdbwd_ms']:8.3f} | {b['fwd_ms']/n['fwd_ms']:11.3f} {b['bwd_ms']/n['bwd_ms']:5.3f}"
          f" {b['fwdbwd_ms']/n['fwdbwd_ms']:5.3f} | {a['bwd_ms']/n['bwd_ms']:11.3f} {a['fwdbwd_ms']/n['fwdbwd_ms']:4.3f}")
PY
