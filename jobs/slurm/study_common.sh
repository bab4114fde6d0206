#!/usr/bin/env bash
# Shared by weak_scaling.sh, strong_scaling.sh and ablation.sh (sourced, not run): submits one
# train.sbatch job per point of a study into one results directory, records the jobs in
# RESULTS/study.json and (SB_REPORT=1) submits a report job that runs after all of them.
#
# Common environment:
#   SB_CONFIG     config (default configs/tiny.toml); SB_SET extra overrides for every job
#   SB_STEPS      train.steps of every job (default 20)
#   SB_BIN        the program (default build/src/sparsebalance); SB_BUILD build dir (build)
#   SB_SBATCH     extra sbatch options for every job, e.g. "--partition=gpu --gpus-per-task=1"
#   SB_CHAIN      1: run the jobs one after another (--dependency=afterany:previous), so they do not
#                 share nodes and timings are clean; 0 (default): independent jobs
#   SB_REPORT     1 (default): also submit a 1-task job, after all others (afterany), that runs
#                 jobs/plots/report_study.py RESULTS (needs python3 with matplotlib on the node)
#   SB_PYTHON     python for the report (default /usr/bin/python3)
#   SB_DRY_RUN    1: print the sbatch commands instead of running them
set -euo pipefail
SB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SB_CONFIG=${SB_CONFIG:-configs/tiny.toml}
SB_STEPS=${SB_STEPS:-20}
SB_BUILD=${SB_BUILD:-build}
SB_BIN=${SB_BIN:-$SB_BUILD/src/sparsebalance}
SB_CHAIN=${SB_CHAIN:-0}
SB_REPORT=${SB_REPORT:-1}
SB_PYTHON=${SB_PYTHON:-/usr/bin/python3}
study_jobs=()
study_points=()
study_prev=

# study_init KIND RESULTS_DIR
study_init() {
  study_kind=$1
  study_dir=$2
  mkdir -p "$study_dir"
  study_dir=$(cd "$study_dir" && pwd)
  [ "${SB_DRY_RUN:-0}" = 1 ] || command -v sbatch >/dev/null || { echo "$0: sbatch not found" >&2; exit 2; }
  if [ -x "$SB_BIN" ]; then SB_BIN=$(readlink -f "$SB_BIN")
  else echo "$0: warning: $SB_BIN is not executable here (it must be on the compute nodes)" >&2; fi
}

# study_submit NAME NTASKS "key=value ..."   (one train.sbatch job; its summary is RESULTS/NAME.json)
study_submit() {
  local name=$1 ntasks=$2 sets=$3
  local dep=()
  if [ "$SB_CHAIN" = 1 ] && [ -n "$study_prev" ]; then dep=(--dependency=afterany:$study_prev); fi
  local cmd=(sbatch --parsable --job-name="sb-$study_kind-$name" --ntasks="$ntasks"
             --output="$study_dir/$name-%j.out" "${dep[@]}" ${SB_SBATCH:-}
             --export=ALL,SB_SET=,SB_CONFIG=,SB_BIN=$SB_BIN,SB_RUN_DIR=$study_dir/$name,SB_SUMMARY=$study_dir/$name.json
             "$SB_ROOT/jobs/slurm/train.sbatch" "$SB_CONFIG" "train.steps=$SB_STEPS" ${SB_SET:-} $sets)
  local id
  if [ "${SB_DRY_RUN:-0}" = 1 ]; then echo "${cmd[*]}"; id=dry$(( ${#study_jobs[@]} + 1 ))
  else id=$("${cmd[@]}"); id=${id%%;*}; fi
  echo "$study_kind: submitted $name ($ntasks task(s), $sets) as job $id" >&2
  study_jobs+=("$id")
  study_points+=("{\"name\": \"$name\", \"ranks\": $ntasks, \"job\": \"$id\", \"sets\": \"$sets\", \"summary\": \"$name.json\"}")
  study_prev=$id
}

# study_finish EXTRA_JSON_FIELDS   (writes study.json; submits the report job)
study_finish() {
  local extra=$1
  local pts
  pts=$(IFS=,; echo "${study_points[*]}")
  cat > "$study_dir/study.json" <<JSON
{"kind": "$study_kind", "config": "$SB_CONFIG", "steps": $SB_STEPS, "set": "${SB_SET:-}", $extra,
 "submitted": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(hostname -s)", "command": "$study_command",
 "points": [$pts]}
JSON
  if [ "$SB_REPORT" = 1 ] && [ "${SB_DRY_RUN:-0}" != 1 ]; then
    local deps
    deps=$(IFS=:; echo "${study_jobs[*]}")
    local rid
    rid=$(sbatch --parsable --job-name="sb-$study_kind-report" --ntasks=1 --dependency=afterany:$deps \
          --output="$study_dir/report-%j.out" \
          --wrap="$SB_PYTHON $SB_ROOT/jobs/plots/report_study.py $study_dir")
    echo "$study_kind: report job ${rid%%;*} (after all) -> $study_dir/report.md" >&2
  fi
  echo "$study_dir"
}
