#!/usr/bin/env bash
# One real point of "Where DST pays for speed" (bench/results/2026-12-02-dst-real-point.md, bench/studies/dst_share_sweep.sh): DST
# alone (sequential+dst over sequential+fixed, same batches) measured by real CPU training at a large
# attention share, beside what `simulate` predicts for the same setup.
#   bash bench/studies/dst_real_point.sh [BUILD_DIR] [ROUNDS] [STEPS]      # defaults: build 4 40 (~7 min on 2 cores)
#   env: OUT (bench/out/dst_real), NP (2 ranks, one core and one BLAS thread each: do not oversubscribe)
# Steps, all with configs/dst_real.toml (d_model 32, 2 layers, Bs 32, k0 16, max_change 0.3):
#   1. prep synth --preset longalign --max-len 8192 (2000 documents) -> OUT/data
#   2. mpirun -np NP sparsebalance profile -> OUT/profile.h5: the fitted latency model of this machine
#   3. sparsebalance simulate --profile OUT/profile.h5 (NP ranks, 8192-token micro-batches, k0 16,
#      max_len 8192, fill 1, 200 steps) -> OUT/simulate.json: the predicted DST-alone speedup
#   4. ROUNDS x (fixed, dst), alternated A B A B: mpirun -np NP sparsebalance train with
#      balance.profile = OUT/profile.h5 and balance.ema = 0 in both (the same frozen latency model,
#      so both plan from identical predictions; self_profile off), same seed, data, steps
#   5. fixed runs at attention.k = KS ("0 11 21": anchors only, and DST's bounds k0(1 -+ 0.3)): the
#      measured budget-dependent part of a step and the measured against the predicted compute per k
# Prints (Markdown): the attention share (profile fit: one 8192-token document and the token-weighted
# corpus; measured: compute at k0 against k = 0), compute measured / predicted per k, one row per run (step ms mean / sd over steps,
# imbalance, bubble, recall, budgets above/below k0, load average before the run), the per-round
# ratios, mean and spread, and the predicted ratios: simulate's, and the trainer's own latency model
# on the real batches (mean over steps of max over ranks of predicted_ms, fixed over dst).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}; ROUNDS=${2:-4}; STEPS=${3:-40}
NP=${NP:-2}
KS=${KS:-"0 11 21"}
OUT=${OUT:-bench/out/dst_real}
SB=$BUILD/src/sparsebalance
[ -x "$SB" ] || { echo "dst_real_point.sh: $SB not found (build the sparsebalance target first)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
MPI="mpirun -np $NP --bind-to core"
CFG=configs/dst_real.toml
K0=$(/usr/bin/python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["attention"]["k"])' "$CFG")
mkdir -p "$OUT"
DATA=$OUT/data
[ -f "$DATA/shard_00000.h5" ] || $SB prep synth --preset longalign --docs 2000 --seed 7 --max-len 8192 --min-len 64 \
  --output "$DATA" > /dev/null
COMMON=(--set data.path="$DATA" --set train.steps="$STEPS" --set train.global_batch_tokens=$((NP * 16384))
        --set balance.ema=0 --set balance.self_profile=false --set log.progress=false)
$MPI $SB profile $CFG "${COMMON[@]}" --output "$OUT/profile.h5" --summary "$OUT/profile.json" > "$OUT/profile.log"
$SB simulate $CFG "${COMMON[@]}" --profile "$OUT/profile.h5" --set simulate.ranks="$NP" --set simulate.micro_batches=2 \
  --set simulate.capacity=8192 --set simulate.max_len=8192 --set simulate.k="$K0" --set simulate.fill=1 \
  --set simulate.steps=200 --set simulate.preset=longalign --summary "$OUT/simulate.json" > "$OUT/simulate.log"

run() {  # run NAME --set ...
  local dir=$OUT/$1
  shift
  rm -rf "$dir"; mkdir -p "$dir"
  cut -d' ' -f1 /proc/loadavg > "$dir/load"
  $MPI $SB train $CFG "${COMMON[@]}" --set balance.profile="$OUT/profile.h5" --set checkpoint.dir="$dir/ckpt" \
    --set log.path="$dir/metrics.h5" "$@" --summary "$dir/train.json" > "$dir/train.log"
  rm -rf "$dir/ckpt"
}
for i in $(seq 1 "$ROUNDS"); do
  run "r$i-fixed" --set balance.tuning=fixed
  run "r$i-dst" --set balance.tuning=dst
done
for k in $KS; do run "k$k-fixed" --set balance.tuning=fixed --set attention.k="$k"; done

/usr/bin/python3 - "$OUT" "$ROUNDS" "$DATA" "$K0" $KS <<'PY'
import json, sys, glob
import h5py, numpy as np
out, rounds, data, k0, ks = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), [int(k) for k in sys.argv[5:]]
ROW = "| {} | {:.1f} | {:.1f} | {:.3f} | {:.3f} | {:.4f} | {} / {} | {:.1f} | {:.2f} |"

def load(name):
    t = json.load(open(f"{out}/{name}/train.json"))
    with h5py.File(f"{out}/{name}/metrics.h5", "r") as f:
        ranks = f["ranks"][:]
    r = ranks.reshape(len(t["step_ms"]), -1)
    t["pred_max"] = r["predicted_ms"].max(axis=1).mean()
    t["compute_mean"] = r["compute_ms"].mean()
    t["pred_mean"] = r["predicted_ms"].mean()
    slow = r["predicted_ms"].argmax(axis=1); n = np.arange(len(r))
    t["slow_meas"] = r["compute_ms"][n, slow].mean()  # the rank the model called slowest, as measured
    t["flips"] = int((r["compute_ms"].argmax(axis=1) != slow).sum())  # steps where another rank was slower
    t["load"] = float(open(f"{out}/{name}/load").read())
    return t

# Attention share from the profile's fitted parts (coeffs [part][c0, c1, c2], ms; density 1 = theta keeps all).
with h5py.File(f"{out}/profile.h5", "r") as f:
    g = f["latency"]; c = g["coeffs"][:]; L, Bs, w = int(g.attrs["n_layers"]), int(g.attrs["block_size"]), int(g.attrs["local_blocks"])
def kept(n, k):  # LatencyModel::kept_blocks
    nb = -(-n // Bs); m = w + 2; t = min(nb, m)
    anch = t * (t + 1) / 2 + (nb - t) * m
    U = max(0, nb - w - 2)
    return anch + (U * (U + 1) / 2 if U <= k else k * (k + 1) / 2 + (U - k) * k)
def parts(n, k):  # one document alone, c0 terms left out (one per micro-batch, < 1%)
    nb = -(-n // Bs)
    return L * c[0][2] * kept(n, k) * Bs * Bs, L * (c[1][1] * n + c[1][2] * nb * (nb + 1) / 2), c[2][1] * n
with h5py.File(glob.glob(f"{data}/shard_*.h5")[0], "r") as f:
    lens = np.diff(f["doc_offsets"][:]).astype(np.int64)
def share(ls, k):
    a, g_, l_ = (sum(x) for x in zip(*(parts(int(n), k) for n in ls)))
    return a / (a + g_ + l_)
s8k, scorp = share([8192], k0), share(lens, k0)
sim = json.load(open(f"{out}/simulate.json"))
sp = sim["policies"]
runs = {t: [load(f"r{i}-{t}") for i in range(1, rounds + 1)] for t in ("fixed", "dst")}
kruns = {k: load(f"k{k}-fixed") for k in ks}
fixed_compute = np.mean([t["compute_mean"] for t in runs["fixed"]])
print(f"attention share (profile fit, k0 {k0}): {100*s8k:.1f}% of one 8192-token document (simulate: "
      f"{100*sim['attention_share']:.1f}%), {100*scorp:.1f}% token-weighted over the corpus ({len(lens)} documents)")
if 0 in kruns:
    a16 = sum(parts(int(n), k0)[0] for n in lens); a0 = sum(parts(int(n), 0)[0] for n in lens)
    tot16 = sum(sum(parts(int(n), k0)) for n in lens)
    print(f"budget-dependent part of a rank's compute (k0 {k0} -> k 0): measured "
          f"{100*(1 - kruns[0]['compute_mean'] / fixed_compute):.1f}% (fixed runs' mean compute {fixed_compute:.1f} ms vs "
          f"{kruns[0]['compute_mean']:.1f} ms), profile fit {100*(a16 - a0)/tot16:.1f}%")
print("\n| fixed runs at k | mean rank compute ms, measured | predicted | measured / predicted | measured / measured at k0 | predicted / predicted at k0 |")
print("|---:|---:|---:|---:|---:|---:|")
pred16 = np.mean([t["pred_mean"] for t in runs["fixed"]])
for k, t in sorted(list(kruns.items()) + [(k0, {"compute_mean": fixed_compute, "pred_mean": pred16})]):
    print(f"| {k} | {t['compute_mean']:.1f} | {t['pred_mean']:.1f} | {t['compute_mean']/t['pred_mean']:.3f} | "
          f"{t['compute_mean']/fixed_compute:.3f} | {t['pred_mean']/pred16:.3f} |")
print()
print("| run | step ms (mean) | sd over steps | imbalance | bubble | recall | budgets >k0 / <k0 | pred. max ms | load |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for i in range(rounds):
    for t in ("fixed", "dst"):
        x = runs[t][i]
        print(ROW.format(f"round {i+1} {t}", x["mean_step_ms"], np.std(x["step_ms"]), x["mean_imbalance"], x["mean_bubble"],
                         x["mean_recall"], x["budgets_above_k0"], x["budgets_below_k0"], x["pred_max"], x["load"]))
for k, x in kruns.items():
    print(ROW.format(f"k = {k} fixed", x["mean_step_ms"], np.std(x["step_ms"]), x["mean_imbalance"], x["mean_bubble"],
                     x["mean_recall"], x["budgets_above_k0"], x["budgets_below_k0"], x["pred_max"], x["load"]))
ratios = [f["mean_step_ms"] / d["mean_step_ms"] for f, d in zip(runs["fixed"], runs["dst"])]
mf = np.array([t["mean_step_ms"] for t in runs["fixed"]]); md = np.array([t["mean_step_ms"] for t in runs["dst"]])
print()
print("| | fixed | dst | dst speedup (fixed / dst) |")
print("|---|---:|---:|---:|")
print(f"| step ms, mean of {rounds} runs (min-max) | {mf.mean():.1f} ({mf.min():.1f}-{mf.max():.1f}) | "
      f"{md.mean():.1f} ({md.min():.1f}-{md.max():.1f}) | {mf.mean()/md.mean():.3f} |")
print(f"| per-round ratio: mean (min-max) | | | {np.mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
print(f"| mean rank compute ms, measured / predicted | {fixed_compute / pred16:.3f} | "
      f"{np.mean([t['compute_mean'] for t in runs['dst']]) / np.mean([t['pred_mean'] for t in runs['dst']]):.3f} | |")
sf = np.mean([t["slow_meas"] for t in runs["fixed"]]); sd = np.mean([t["slow_meas"] for t in runs["dst"]])
print(f"| predicted-slowest rank's compute ms, measured | {sf:.1f} | {sd:.1f} | {sf/sd:.3f} |")
print(f"| steps whose slowest rank was not the predicted one | {sum(t['flips'] for t in runs['fixed'])} of "
      f"{sum(len(t['step_ms']) for t in runs['fixed'])} | {sum(t['flips'] for t in runs['dst'])} of "
      f"{sum(len(t['step_ms']) for t in runs['dst'])} | |")
for key, lab in (("mean_imbalance", "imbalance"), ("mean_bubble", "bubble"), ("mean_recall", "recall"), ("mean_pred_error", "prediction error")):
    print(f"| {lab} | {np.mean([t[key] for t in runs['fixed']]):.4f} | {np.mean([t[key] for t in runs['dst']]):.4f} | |")
pf = np.mean([t["pred_max"] for t in runs["fixed"]]); pd = np.mean([t["pred_max"] for t in runs["dst"]])
print(f"| predicted: latency model on these batches (max predicted_ms) | {pf:.1f} | {pd:.1f} | {pf/pd:.3f} |")
print(f"| predicted: simulate (longalign preset, 200 steps) makespan | {sp['sequential+fixed']['makespan']:.1f} | "
      f"{sp['sequential+dst']['makespan']:.1f} | {sp['sequential+dst']['speedup']:.3f} |")
print(f"| simulate imbalance / bubble | {sp['sequential+fixed']['imbalance']:.3f} / {sp['sequential+fixed']['bubble']:.3f} | "
      f"{sp['sequential+dst']['imbalance']:.3f} / {sp['sequential+dst']['bubble']:.3f} | |")
print(f"\nper-round ratios: {' '.join(f'{r:.3f}' for r in ratios)}")
PY
