#!/usr/bin/env bash
# On the GPU machine, after jobs/gpu/build_on_gpu.sh built build-gpu: every kernel of one training
# step under Nsight Compute (duration only, clocks not locked), of CONFIG's shape cut to NLAYERS
# layers (default 2: each layer launches the same kernels, so two show a layer's share without
# profiling thousands of launches) at L tokens a micro-batch, two micro-batches, dense by default
# (MODE). Prints the kernels grouped by name and grid, by total time: which GEMM shapes, elementwise
# kernels and head chunks the step spends its time in (the phase breakdown, bench/gpu/gpu_phase_breakdown.sh,
# gives the totals per phase but not per kernel).
#   CONFIG=configs/qwen2.5-0.5b.toml L=16384 bash bench/gpu/ncu_step.sh     # table on stdout
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
O=${OUT:-gpu-out}
L=${L:-16384}
NLAYERS=${NLAYERS:-2}
MODE=${MODE:-dense}
CONFIG=${CONFIG:-configs/qwen2.5-0.5b.toml}
mkdir -p "$O" runs/ncu_step
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$NCU" ] || { echo "ncu_step: no ncu on this machine"; exit 2; }
data=runs/ncu_step/data_$L
[ -f "$data/shard_00000.h5" ] || "$B/src/sparsebalance" prep synth --preset fixed --docs 4 --max-len "$L" \
    --min-len "$L" --output "$data" > /dev/null || exit 1
rm -rf runs/ncu_step/ckpt
timeout 400 "$NCU" --clock-control none --csv --print-units base --metrics gpu__time_duration.sum \
  "$B/src/sparsebalance" train "$CONFIG" --set model.n_layers="$NLAYERS" --set data.path="$data" \
  --set data.val_fraction=0 --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) \
  --set train.steps=1 --set attention.mode="$MODE" --set balance.tuning=fixed --set balance.self_profile=false \
  --set checkpoint.dir=runs/ncu_step/ckpt --set log.path=runs/ncu_step/metrics.h5 > "$O/ncu_step.csv" 2> "$O/ncu_step.err"
echo "ncu rc $? ($(grep -c gpu__time_duration "$O/ncu_step.csv") kernels)"
python3 - "$O/ncu_step.csv" <<'PY'
import collections, csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
ix = {n: i for i, n in enumerate(head)}
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    if r[ix["Metric Name"]] != "gpu__time_duration.sum": continue
    key = (r[ix["Kernel Name"]][:90], r[ix["Grid Size"]], r[ix["Block Size"]])
    agg[key][0] += 1
    agg[key][1] += float(r[ix["Metric Value"]].replace(",", "")) / 1e6  # ns -> ms
total = sum(v[1] for v in agg.values())
print(f"all kernels: {total:.2f} ms GPU time (one step, serialized by the profiler)\n")
print(f"| kernel | grid | block | launches | total ms | mean us | share |\n|---|---|---|---:|---:|---:|---:|")
for (k, g, b), (n, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:45]:
    print(f"| {k} | {g} | {b} | {n} | {ms:.3f} | {1e3 * ms / n:.1f} | {100 * ms / total:.1f}% |")
PY
