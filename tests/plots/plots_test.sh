#!/usr/bin/env bash
# Test of the plot/report tools on real output: trains a few tiny steps with 2 ranks (mpirun) and
# with 1 rank, runs jobs/plots/plot_run.py on the 2-rank metrics log and jobs/plots/report_study.py on a
# strong-scaling results directory made of the two runs, then checks that every PNG exists, is a
# PNG, is not tiny and is not a single colour (pixel variance, read back with matplotlib), and that
# the report's Markdown table lists both rank counts. Then the accuracy tools (bench/analysis/accuracy_collect.py,
# bench/analysis/accuracy_policies.py, jobs/plots/plot_accuracy.py) on a real eval of the 1-rank checkpoint.
# Exits 77 (ctest SKIP_RETURN_CODE) when /usr/bin/python3 lacks h5py or matplotlib.
#
# usage: tests/plots/plots_test.sh SPARSEBALANCE_BINARY SOURCE_DIR [SCRATCH_DIR]
set -uo pipefail
BIN=$(readlink -f "${1:?usage: plots_test.sh BINARY SOURCE_DIR [SCRATCH]}")
SRC=$(readlink -f "${2:?usage: plots_test.sh BINARY SOURCE_DIR [SCRATCH]}")
PY=${SB_PYTHON:-/usr/bin/python3}
say() { echo "[plots_test] $*"; }
fail() { say "FAIL: $*"; exit 1; }
if ! "$PY" -c 'import h5py, numpy, matplotlib' 2>/dev/null; then
  say "SKIP: $PY has no h5py/numpy/matplotlib (Debian: apt-get install python3-h5py python3-matplotlib)"
  exit 77
fi
D=${3:-$(mktemp -d /tmp/sb-plots-test.XXXXXX)}
mkdir -p "$D"
D=$(readlink -f "$D")
keep=0
trap '[ $? -eq 0 ] && [ "$keep" = 0 ] && [ -z "${3:-}" ] && rm -rf "$D"' EXIT

# A clean environment for the MPI child processes (nothing inherited from an enclosing launch).
run() {
  env -i PATH="$PATH" HOME="${HOME:-/root}" LANG=C.UTF-8 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    ${ASAN_OPTIONS+ASAN_OPTIONS="$ASAN_OPTIONS"} ${LSAN_OPTIONS+LSAN_OPTIONS="$LSAN_OPTIONS"} \
    ${UBSAN_OPTIONS+UBSAN_OPTIONS="$UBSAN_OPTIONS"} \
    ${OMPI_MCA_mca_base_component_disable_dlclose+OMPI_MCA_mca_base_component_disable_dlclose=1} \
    OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1 "$@"
}
run "$BIN" prep synth --docs 120 --max-len 512 --min-len 48 --seed 3 --output "$D/data" > "$D/prep.log" 2>&1 \
  || { cat "$D/prep.log"; fail "prep synth"; }
TINY=(--set data.path="$D/data" --set model.d_model=32 --set model.ffn_dim=64 --set train.global_batch_tokens=2048
      --set train.micro_batch_tokens=512 --set attention.block_size=16 --set train.warmup_steps=2 --set train.steps=6
      --set log.every=1 --set checkpoint.every=100 --set log.progress=false)
mkdir -p "$D/study"
for n in 1 2; do
  run mpirun --allow-run-as-root --oversubscribe -np $n "$BIN" train "$SRC/configs/tiny.toml" "${TINY[@]}" \
    --set checkpoint.dir="$D/study/n$n/ckpt" --set log.path="$D/study/n$n/metrics.h5" \
    --summary "$D/study/n$n.json" > "$D/train$n.log" 2>&1 || { cat "$D/train$n.log"; fail "train with $n rank(s)"; }
done
say "trained 6 steps with 1 and 2 ranks"

"$PY" "$SRC/jobs/plots/plot_run.py" "$D/study/n2/metrics.h5" --out "$D/plots" --prefix run > "$D/plot.log" 2>&1 \
  || { cat "$D/plot.log"; fail "plot_run.py"; }
cat > "$D/study/study.json" <<EOF
{"kind": "strong", "config": "configs/tiny.toml", "steps": 6, "global_batch_tokens": 2048, "command": "plots_test.sh",
 "submitted": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(hostname -s)",
 "points": [{"name": "n1", "ranks": 1, "job": "-", "summary": "n1.json"},
            {"name": "n2", "ranks": 2, "job": "-", "summary": "n2.json"}]}
EOF
"$PY" "$SRC/jobs/plots/report_study.py" "$D/study" --out "$D/report" > "$D/report.log" 2>&1 \
  || { cat "$D/report.log"; fail "report_study.py"; }
grep -qE '^\| 1 \| - \| 1\.\.6 \|' "$D/report/report.md" && grep -qE '^\| 2 \| - \| 1\.\.6 \|' "$D/report/report.md" \
  || { cat "$D/report/report.md"; fail "report.md lacks the rows of 1 and 2 ranks"; }

# bench/gpu/accuracy.sh refuses an ACC_STEPS without one count per stage, naming the stages, before it
# prepares anything.
(cd "$SRC" && ACC_SCALE=tiny ACC_STEPS="1 2" ACC_RUNS="$D/acc_steps" SB="$BIN" bash bench/gpu/accuracy.sh) > "$D/acc_steps.log" 2>&1 \
  && { cat "$D/acc_steps.log"; fail "accuracy.sh took ACC_STEPS=\"1 2\" for three stages"; }
grep -qF 'ACC_STEPS="1 2": expected 3 step counts (copy short long)' "$D/acc_steps.log" \
  || { cat "$D/acc_steps.log"; fail "accuracy.sh's ACC_STEPS message"; }
[ ! -e "$D/acc_steps/data_copy" ] || fail "accuracy.sh prepared a corpus before refusing ACC_STEPS"

# The accuracy tools (bench/gpu/accuracy.sh's and bench/gpu/accuracy_policies.sh's readers) on a real eval
# of the 1-rank run: the CSV's per-bucket task counts add up to the overall ones, both plots drawn.
mkdir -p "$D/acc/eval" "$D/pol/dense_s1" "$D/pol/start"
run "$BIN" prep synth --preset uniform --docs 30 --min-len 100 --max-len 400 --seed 5 --mask answers \
  --output "$D/evaldata" > "$D/prep2.log" 2>&1 || { cat "$D/prep2.log"; fail "prep synth (eval corpus)"; }
run "$BIN" eval --checkpoint "$D/study/n1/ckpt/ckpt_00000006.h5" --set data.path="$D/evaldata" --set data.val_fraction=0.9 \
  --set eval.docs=12 --set eval.buckets=200,300 \
  --summary "$D/acc/eval/pre_6.json" --diagnose "$D/acc/diag.json" > "$D/eval.log" 2>&1 || { cat "$D/eval.log"; fail "eval"; }
"$PY" "$SRC/bench/analysis/diagnose_table.py" "$D/acc/diag.json" --heads > "$D/diag.md" 2> "$D/diag.log" || { cat "$D/diag.log"; fail "diagnose_table.py"; }
grep -qE '^\| oracle gate \| ' "$D/diag.md" && grep -qE '^\| 1 \| 1 \| ' "$D/diag.md" || { cat "$D/diag.md"; fail "diag.md lacks the oracle row or layer 1's head 1"; }
cp "$D/study/n1/metrics.h5" "$D/acc/metrics_pre.h5"
cp "$D/acc/eval/pre_6.json" "$D/pol/dense_s1/eval.json" && cp "$D/acc/eval/pre_6.json" "$D/pol/start/eval.json" && cp "$D/study/n1.json" "$D/pol/dense_s1/train.json"
"$PY" "$SRC/bench/analysis/accuracy_collect.py" "$D/acc" --stages pre --from 201 --csv "$D/acc/accuracy.csv" \
  --summary "$D/acc/summary.json" > "$D/collect.log" 2>&1 || { cat "$D/collect.log"; fail "accuracy_collect.py"; }
"$PY" "$SRC/bench/analysis/accuracy_policies.py" "$D/pol" --from 201 --csv "$D/pol/policies.csv" --md "$D/pol/policies.md" \
  > "$D/policies.log" 2>&1 || { cat "$D/policies.log"; fail "accuracy_policies.py"; }
grep -qE '^\| dense \| 1 \|' "$D/pol/policies.md" || { cat "$D/pol/policies.md"; fail "policies.md lacks the dense row"; }
grep -qE '^\| start \(sparse eval\) \| - \|' "$D/pol/policies.md" || { cat "$D/pol/policies.md"; fail "policies.md lacks the start rows"; }
# bench/analysis/gate_sweep.py (bench/gpu/accuracy_gates.sh's reader): two variants of the same eval; the
# table has both rows, and the best trainable variant skips qmax however it scored.
mkdir -p "$D/gates" && cp "$D/acc/eval/pre_6.json" "$D/gates/base.json" && cp "$D/acc/eval/pre_6.json" "$D/gates/qmax.json"
"$PY" "$SRC/bench/analysis/gate_sweep.py" "$D/gates" --from 201 --md "$D/gates.md" --best "$D/gates.best" > "$D/gates.log" 2>&1 \
  || { cat "$D/gates.log"; fail "gate_sweep.py"; }
grep -qE '^\| base \| ' "$D/gates.md" && grep -qE '^\| qmax \| ' "$D/gates.md" && [ "$(cat "$D/gates.best")" = base ] \
  || { cat "$D/gates.md" "$D/gates.best"; fail "gate_sweep.py: rows or best"; }
for k in curve:acc/accuracy policies:pol/policies; do
  "$PY" "$SRC/jobs/plots/plot_accuracy.py" "${k%%:*}" "$D/${k#*:}.csv" --out "$D/plots/${k%%:*}.png" > "$D/pa.log" 2>&1 \
    || { cat "$D/pa.log"; fail "plot_accuracy.py ${k%%:*}"; }
done
"$PY" - "$D/acc/accuracy.csv" "$D/acc/eval/pre_6.json" <<'PY' || fail "accuracy.csv counts"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ev = json.load(open(sys.argv[2]))
for att, key in (("dense", "task_accuracy"), ("sparse", "task_accuracy_sparse")):
    total = ev[key]["overall"]["total"]
    buckets = sum(int(r["total"]) for r in rows if r["attention"] == att and r["task"] == "overall"
                  and r["lengths"] not in ("all", "target"))
    assert total > 0 and buckets == total, (att, total, buckets)
    assert ev["docs"] >= total
    # --mask answers, one question: the trained span of a record is its task's answer, so the
    # record exact match (span_accuracy) is the task exact match
    span = ev["span_accuracy" + key[len("task_accuracy"):]]
    assert (span["correct"], span["total"]) == (ev[key]["overall"]["correct"], total), (att, span, ev[key]["overall"])
print("ok accuracy.csv: per-bucket task counts add up to", total, "and span_accuracy equals task accuracy")
PY
say "accuracy tools: eval -> accuracy.csv, policies.md, two plots; eval --diagnose -> diag.md"

"$PY" - "$D" <<'PY' || fail "PNG checks"
import sys, os
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.image as mpimg
d = sys.argv[1]
want = [f"{d}/plots/run_{n}.png" for n in ("rank_time", "budgets", "prediction", "loss")]
want += [f"{d}/report/strong_{n}.png" for n in ("speedup", "efficiency")]
want += [f"{d}/plots/{n}.png" for n in ("curve", "policies")]
bad = 0
for p in want:
    if not os.path.exists(p):
        print(f"missing {p}"); bad += 1; continue
    size = os.path.getsize(p)
    with open(p, "rb") as f:
        magic = f.read(8)
    img = mpimg.imread(p)
    rgb = img[..., :3] if img.ndim == 3 else img
    colours = len(np.unique(rgb.reshape(-1, rgb.shape[-1] if rgb.ndim == 3 else 1), axis=0))
    var = float(rgb.var())
    ok = magic == b"\x89PNG\r\n\x1a\n" and size > 10000 and img.shape[0] >= 200 and img.shape[1] >= 300 \
        and var > 1e-3 and colours > 16
    print(f"{'ok ' if ok else 'BAD'} {os.path.basename(p)}: {size} bytes, {img.shape[1]}x{img.shape[0]}, "
          f"{colours} colours, variance {var:.4f}")
    bad += not ok
sys.exit(1 if bad else 0)
PY
# bench/gpu/gpu_scaling.sh's dry run on the CPU, its context-parallel part (one 2,048-token document a
# step: whole on one rank, in windows of 1,024, split over 2 ranks), and bench/analysis/gpu_scaling_report.py
# on it: the split run's losses equal the whole run's (fp32 on the CPU), every row is there.
say "bench/gpu/gpu_scaling.sh dry run (PARTS=cp, 2 ranks)"
(cd "$D" && run SB="$BIN" PYTHON="$PY" OUT="$D/scaling" RUNS="$D/scaling_runs" NGPU=2 STEPS=2 PARTS=cp CP_LEN=2048 \
   EXTRA="--set train.device=cpu --set model.n_layers=2 --set model.d_model=64 --set model.n_heads=1 --set model.n_kv_heads=1 --set model.ffn_dim=128" \
   bash "$SRC/bench/gpu/gpu_scaling.sh") > "$D/scaling.log" 2>&1 || { cat "$D/scaling.log"; fail "bench/gpu/gpu_scaling.sh"; }
"$PY" - "$D/scaling/gpu_scaling.md" <<'PY' || { cat "$D/scaling.log"; fail "gpu_scaling report"; }
import sys
rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]] for l in open(sys.argv[1]) if l.startswith("| ")}
for want in ("one GPU, whole (layer recomputation)", "one GPU, windows of 1/2", "split over 2"):
    assert want in rows and rows[want][1] not in ("", "failed"), f"row {want!r}: {rows.get(want)}"
diff = float(rows["split over 2"][3])
print(f"split over 2 against whole: max rel loss diff {diff:.2e}")
assert diff < 1e-5, diff
PY
# bench/gpu/sass_mix.py (Nsight Compute's per-SASS export, here a hand-made one of its layout): the
# opcode totals with the predicate guard stripped, --per, the top stall site, and a clear error on a CSV
# that is not such an export.
say "bench/gpu/sass_mix.py on an ncu source-page export"
cat > "$D/sass.csv" <<'CSV'
"Kernel Name","void k<64>(P)",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed"
"0x10","      FFMA R1, R2, R3, R4","5","4","300"
"0x20","@!P0  FFMA R5, R2, R3, R4","7","6","100"
"0x30","      HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ","90","80","200"
"0x40","      IMAD.MOV.U32 R1, RZ, RZ, R2","0","0","400"
CSV
"$PY" "$SRC/bench/gpu/sass_mix.py" "$D/sass.csv" --per 100 --top 2 > "$D/sass.out" 2> "$D/sass.err" \
  || { cat "$D/sass.err"; fail "sass_mix.py"; }
"$PY" - "$D/sass.out" <<'PY' || { cat "$D/sass.out"; fail "sass_mix.py output"; }
import sys
lines = open(sys.argv[1]).read().splitlines()
assert "4 SASS instructions, 1,000 executed (warp level), 102 stall samples" in lines[1], lines[1]
ops = {l.split()[0]: l.split()[1:] for l in lines[3:6]}
assert ops["FFMA"][:2] == ["4.0", "40.0%"], ops  # 300 + 100 (the guarded one), / 100
assert ops["IMAD"][:2] == ["4.0", "40.0%"] and ops["HGMMA"][0] == "2.0", ops
assert ops["HGMMA"][2] == "88.2%", ops  # 90 of 102 samples
top = [l for l in lines if l.strip().startswith("2 ")]
assert top and "HGMMA" in top[0] and "90" in top[0], lines
PY
printf 'L,density\n1,2\n' > "$D/notsass.csv"
if "$PY" "$SRC/bench/gpu/sass_mix.py" "$D/notsass.csv" > /dev/null 2> "$D/sass.err"; then fail "sass_mix.py took a non-ncu CSV"; fi
grep -q "no 'Address' header row" "$D/sass.err" || { cat "$D/sass.err"; fail "sass_mix.py error message"; }
# bench/analysis/bwd_trace.py on a hand-made trace (1 GHz: cycles = ns): two SMs, three CTAs of 8, 4 and 16
# tiles at 100 cycles a tile, 100 before each first tile, 100 after each last; 100 between the two
# CTAs of SM 0, which ends 100 before SM 1 (the last wave): shares of 2 x 1,800 cycles.
say "bench/analysis/bwd_trace.py on a per-CTA trace"
cat > "$D/trace.csv" <<'CSV'
L,density,cta,start_ns,end_ns,sm,tiles,start_clk,first_tile_clk,last_tile_clk,dq_staged_clk,waited_clk,end_clk
16384,1,0,0,1000,0,8,5000,5100,5900,5950,5980,6000
16384,1,1,1100,1700,0,4,6100,6200,6600,6650,6680,6700
16384,1,2,0,1800,1,16,9000,9100,10700,10750,10780,10800
CSV
"$PY" "$SRC/bench/analysis/bwd_trace.py" "$D/trace.csv" > "$D/trace.out" 2> "$D/trace.err" || { cat "$D/trace.err"; fail "bwd_trace.py"; }
"$PY" - "$D/trace.out" <<'PY' || { cat "$D/trace.out"; fail "bwd_trace.py output"; }
import sys
row = open(sys.argv[1]).read().splitlines()[1].replace("|", " ").split()
assert row[:4] == ["16384", "1.00", "3", "28"] and row[5] == "1.00", row
assert row[6:12] == ["77.8", "8.3", "8.3", "2.8", "0.0", "2.8"], row  # tiles, before, after, between, lead, last wave
assert row[12:16] == ["100", "0", "100", "100"] and row[16] == "50/30/20", row
PY
if "$PY" "$SRC/bench/analysis/bwd_trace.py" "$D/notsass.csv" > /dev/null 2> "$D/trace.err"; then fail "bwd_trace.py took a non-trace CSV"; fi
grep -q "not a bench_attention_cuda --trace CSV" "$D/trace.err" || { cat "$D/trace.err"; fail "bwd_trace.py error message"; }
say "PASS"
