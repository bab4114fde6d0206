#!/usr/bin/env bash
# Integration test against a real Slurm: starts munged + slurmctld + slurmd on this machine (a
# one-node cluster in a scratch directory, as in tests/README.md, "A real Slurm on one
# machine"), then
#   1. submits jobs/slurm/train.sbatch (2 tasks, srun --mpi=pmix) on a tiny config and checks the
#      job state, the output file, the summary JSON, the checkpoints and the metrics log;
#   2. preemption: submits a longer run, signals it (scancel --batch --signal=USR1) once a few
#      steps have run, and checks that it checkpointed at the signal, requeued itself
#      (SLURM_RESTART_COUNT / scontrol Restarts), resumed from that checkpoint and finished every
#      step exactly once (metrics log /steps = 1..N, restart summary first_step = signal step + 1).
#   3. when `sparsebalance profile --output` exists (and SB_SLURM_PROFILE != 0): jobs/slurm/profile.sbatch
#      (SB_QUICK=1) writes the profile file and its summary;
#   4. (SB_SLURM_STUDIES != 0) weak_scaling.sh (1, 2 ranks) and ablation.sh (4 policies), 3 steps each,
#      chained, with their report jobs: every job COMPLETED, summaries, report.md and PNGs.
# Installs nothing: needs root and the Debian packages slurmctld slurmd slurm-client munge; exits
# 77 (ctest SKIP_RETURN_CODE) when they are missing or when not root.
#
# usage: tests/slurm/slurm_test.sh SPARSEBALANCE_BINARY SOURCE_DIR [SCRATCH_DIR]
#   env: SB_SLURM_KEEP=1 keeps the scratch dir; SB_SLURM_TIMEOUT (s, default 90) per job wait;
#        SB_SLURM_PARTS (default "1 2 3 4") picks the parts; SB_SLURM_PROFILE=0 / SB_SLURM_STUDIES=0
#        leave out parts 3 / 4; SB_SLURM_STUDY_STEPS (3) and
#        SB_SLURM_STUDY_SET (space-separated key=value, default the tiny overrides) size part 4, e.g.
#        for a measurement: SB_SLURM_STUDY_STEPS=20 SB_SLURM_STUDY_SET="train.warmup_steps=4"
set -uo pipefail
BIN=$(readlink -f "${1:?usage: slurm_test.sh BINARY SOURCE_DIR [SCRATCH]}")
SRC=$(readlink -f "${2:?usage: slurm_test.sh BINARY SOURCE_DIR [SCRATCH]}")
SKIP=77
T0=$(date +%s)
say() { echo "[slurm_test +$(( $(date +%s) - T0 ))s] $*"; }

# ---- skip conditions (only these two)
if [ "$(id -u)" != 0 ]; then say "SKIP: needs root (slurmd and munged run as root here)"; exit $SKIP; fi
missing=
for p in munged mungekey slurmctld slurmd sbatch scontrol scancel sinfo srun; do
  command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || missing="$missing $p"
done
if [ -n "$missing" ]; then
  say "SKIP: Slurm/munge programs missing:$missing (apt-get install slurmctld slurmd slurm-client munge)"
  exit $SKIP
fi
export PATH=$PATH:/usr/sbin:/sbin
[ -x "$BIN" ] || { say "FAIL: $BIN is not executable"; exit 1; }

# ---- a clean environment: nothing from an enclosing MPI launch or Slurm job leaks into ours
for v in $(env | grep -oE '^(OMPI|PMIX|SLURM|SBATCH|SRUN|SALLOC)_[A-Za-z0-9_]*' || true); do unset "$v"; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

D=${3:-$(mktemp -d /tmp/sb-slurm-test.XXXXXX)}
mkdir -p "$D"
D=$(readlink -f "$D")
say "scratch dir $D"
HOST=$(hostname -s)
NCPU=$(nproc)

# ---- daemons, and their cleanup on any exit
pids_to_stop=()
stop_daemons() {
  local f
  for f in "$D/slurmd.pid" "$D/slurmctld.pid" "$D/munged.pid"; do
    [ -f "$f" ] || continue
    local p
    p=$(cat "$f" 2>/dev/null)
    [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && { kill -KILL "$p" 2>/dev/null; echo "killed $f ($p) with SIGKILL"; }
  done
}
dump_logs() {
  local f
  for f in "$D/slurmctld.log" "$D/slurmd.log" "$D/munged.log" "$D"/*.out; do
    [ -f "$f" ] || continue
    echo "======== $f (last 60 lines)"
    tail -n 60 "$f"
  done
  echo "======== scontrol show jobs"
  scontrol show jobs 2>&1 | tail -n 60
}
cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ]; then dump_logs; fi
  # cancel any job still there, then stop the daemons we started (by their pid files)
  [ -n "${SLURM_CONF:-}" ] && scancel --quiet --full --signal=KILL --partition=sbtest 2>/dev/null
  stop_daemons
  if [ "${SB_SLURM_KEEP:-0}" = 1 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ]; }; then say "kept $D"
  else rm -rf "$D"; fi
  say "exit $rc"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { say "FAIL: $*"; exit 1; }

# Free TCP ports for slurmctld and slurmd (other engineers may run a test like this one at once).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
  local p
  for _ in $(seq 100); do
    p=$(( 20000 + (RANDOM % 20000) ))
    if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi
  done
  echo 6817
}
PORT=$(pick_port)

# ---- munge
mkdir -p "$D/munge" "$D/state" "$D/spool" "$D/run"
chmod 755 "$D" "$D/munge"
mungekey --create --keyfile="$D/munge/munge.key" || fail "mungekey"
chmod 600 "$D/munge/munge.key"
SOCK=$D/munge/munge.socket
munged --key-file="$D/munge/munge.key" --socket="$SOCK" --pid-file="$D/munged.pid" \
  --log-file="$D/munged.log" --seed-file="$D/munge/munge.seed" || fail "munged did not start"
for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || fail "munged socket $SOCK did not appear"

# ---- slurm.conf for this host
export SLURM_CONF=$D/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=sbtest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK,cred_expire=5
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
KillWait=10
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NCPU RealMemory=1000 State=UNKNOWN
PartitionName=sbtest Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
slurmctld -f "$SLURM_CONF" -c || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
state=
for _ in $(seq 150); do
  state=$(sinfo -h -o %T 2>/dev/null | head -1)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "the node did not become idle (sinfo state '$state')"
say "slurm up: node $HOST ($NCPU CPUs) idle, ctld port $PORT"

# ---- helpers
# job_field ID FIELD: one field of `scontrol show job` (empty once the job record is gone)
job_field() { scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# wait_job ID TIMEOUT: until the job is in a final state; prints the state
wait_job() {
  local id=$1 to=$2 t=0 st=
  while [ "$t" -lt $((to * 5)) ]; do
    st=$(job_field "$id" JobState)
    case "$st" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
      echo "$st"; return 0;; esac
    sleep 0.2; t=$((t + 1))
  done
  echo "TIMEOUT_WAITING($st)"
}
# json FILE KEY: a top-level scalar of a summary JSON
json() { sed -n "s/^  \"$2\": \\(.*\\),\\{0,1\\}$/\\1/p" "$1" | sed 's/,$//; s/^"//; s/"$//' | head -1; }
# steps_in_log LOG: the /steps table's step numbers, space-separated
steps_in_log() {
  if /usr/bin/python3 -c 'import h5py' 2>/dev/null; then
    /usr/bin/python3 - "$1" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r", libver="latest", swmr=True) as f:
    print(" ".join(str(int(s)) for s in f["steps"]["step"]))
PY
  else  # no h5py: the row count from `inspect` and the (last ten) steps it lists
    local n
    n=$("$BIN" inspect "$1" | sed -n 's/.*metrics log, \([0-9]*\) steps.*/\1/p')
    "$BIN" inspect "$1" | awk -v n="$n" '/^ +[0-9]+ +[0-9.]+ / {s = s $1 " "} END {print "rows=" n " last: " s}'
  fi
}
expect_steps() {  # LOG N: steps 1..N, each once
  local got want
  got=$(steps_in_log "$1")
  want=$(seq -s ' ' 1 "$2")
  if [[ "$got" == rows=* ]]; then
    [ "${got%% *}" = "rows=$2" ] || fail "$1: /steps has ${got%% *} rows, expected $2 ($got)"
    say "  (no h5py: checked the row count and the last steps only: $got)"
  else
    [ "$got" = "$want" ] || fail "$1: /steps holds steps '$got', expected 1..$2 each once"
  fi
}

# ---- data and common settings
"$BIN" prep synth --docs 120 --max-len 512 --min-len 48 --seed 3 --output "$D/data" > "$D/prep.log" 2>&1 \
  || { cat "$D/prep.log"; fail "prep synth"; }
TINY="data.path=$D/data model.d_model=32 model.ffn_dim=64 train.global_batch_tokens=2048 train.micro_batch_tokens=512 attention.block_size=16 train.warmup_steps=2 log.every=1"
SBATCH=(sbatch --parsable --chdir="$SRC" --ntasks=2 --export=ALL,SB_BIN=$BIN)

PARTS=" ${SB_SLURM_PARTS:-1 2 3 4} "
part() { [[ "$PARTS" == *" $1 "* ]]; }

# ==== 1. one training run as a batch job
if part 1; then
N1=12
RUN1=$D/run1
id1=$("${SBATCH[@]}" --job-name=sbtest-train --output="$D/train-%j.out" \
      --export=ALL,SB_BIN=$BIN,SB_RUN_DIR=$RUN1,SB_SET="$TINY checkpoint.every=4 train.steps=$N1" \
      "$SRC/jobs/slurm/train.sbatch" configs/tiny.toml) || fail "sbatch train.sbatch"
id1=${id1%%;*}
say "1. submitted train.sbatch as job $id1 ($N1 steps, 2 tasks)"
st=$(wait_job "$id1" "${SB_SLURM_TIMEOUT:-90}")
out1=$D/train-$id1.out
[ -f "$out1" ] || fail "job $id1 wrote no output file train-$id1.out (%j naming)"
say "   job $id1: $st, ExitCode $(job_field "$id1" ExitCode), Restarts $(job_field "$id1" Restarts)"
if [ "$st" != COMPLETED ]; then
  cat "$out1"
  grep -q "latest: no such file" "$out1" && say "note: 'train --resume' with no checkpoint yet must start fresh" \
    "(train --help); this program fails instead, so every first start of train.sbatch fails"
  fail "job $id1 ended $st, expected COMPLETED"
fi
[ "$(job_field "$id1" ExitCode)" = 0:0 ] || fail "job $id1 exit code $(job_field "$id1" ExitCode)"
grep -q "srun exited with status 0" "$out1" || fail "no 'srun exited with status 0' in $out1"
grep -q -- "--mpi=pmix" "$out1" || fail "train.sbatch did not use srun --mpi=pmix"
grep -q -- "--resume" "$out1" || fail "train.sbatch did not pass --resume"
grep -q "train: 2 rank(s)" "$out1" || fail "the run did not have 2 ranks"
grep -q "resume: no checkpoint in $RUN1/ckpt, starting fresh" "$out1" || fail "a first start should start fresh"
S1=$RUN1/summary.json
[ -f "$S1" ] || fail "no summary $S1"
[ "$(json "$S1" first_step)" = 1 ] && [ "$(json "$S1" last_step)" = $N1 ] && [ "$(json "$S1" ranks)" = 2 ] \
  || fail "summary: first_step $(json "$S1" first_step), last_step $(json "$S1" last_step), ranks $(json "$S1" ranks)"
[ "$(json "$S1" stopped_early)" = false ] || fail "summary says stopped_early"
for s in 4 8 12; do
  [ -f "$(printf '%s/ckpt/ckpt_%08d.h5' "$RUN1" $s)" ] || fail "no checkpoint for step $s in $RUN1/ckpt ($(ls "$RUN1/ckpt"))"
done
expect_steps "$RUN1/metrics.h5" $N1
say "   ok: COMPLETED 0:0, summary steps 1..$N1 on 2 ranks, checkpoints 4/8/12, metrics log 1..$N1"
fi

# ==== 2. preemption: USR1 -> checkpoint -> requeue -> resume -> finish
if part 2; then
N2=${SB_SLURM_STEPS2:-40}
RUN2=$D/run2
id2=$("${SBATCH[@]}" --job-name=sbtest-preempt --output="$D/preempt-%j.out" \
      --export=ALL,SB_BIN=$BIN,SB_RUN_DIR=$RUN2,SB_SET="$TINY checkpoint.every=1000 checkpoint.keep=5 train.steps=$N2" \
      "$SRC/jobs/slurm/train.sbatch" configs/tiny.toml) || fail "sbatch (preemption run)"
id2=${id2%%;*}
out2=$D/preempt-$id2.out
say "2. submitted the preemption run as job $id2 ($N2 steps)"
# wait until a few steps have run (progress lines "step     3/30 | ...")
seen=0
for _ in $(seq $(( ${SB_SLURM_TIMEOUT:-90} * 5 ))); do
  seen=$(grep -oE '^step +[0-9]+/' "$out2" 2>/dev/null | tail -1 | grep -oE '[0-9]+' || echo 0)
  [ "${seen:-0}" -ge 2 ] && break
  st=$(job_field "$id2" JobState)
  case "$st" in COMPLETED|FAILED|CANCELLED|TIMEOUT) fail "job $id2 ended ($st) before it could be signalled";; esac
  sleep 0.2
done
[ "${seen:-0}" -ge 2 ] || fail "job $id2 did not reach step 2 in time"
scancel --batch --signal=USR1 "$id2" || fail "scancel --batch --signal=USR1 $id2"
say "   step $seen seen: sent SIGUSR1 to the batch shell (scancel --batch --signal=USR1 $id2)"
# the job requeues (Restarts=1) and then completes
restarts=0
for _ in $(seq $(( ${SB_SLURM_TIMEOUT:-90} * 5 ))); do
  restarts=$(job_field "$id2" Restarts)
  [ "${restarts:-0}" -ge 1 ] && break
  sleep 0.2
done
[ "${restarts:-0}" -ge 1 ] || fail "job $id2 was not requeued (Restarts=$restarts, state $(job_field "$id2" JobState))"
say "   requeued: Restarts=$restarts"
st=$(wait_job "$id2" "${SB_SLURM_TIMEOUT:-90}")
say "   job $id2: $st, ExitCode $(job_field "$id2" ExitCode), Restarts $(job_field "$id2" Restarts)"
[ "$st" = COMPLETED ] || fail "job $id2 ended $st after the requeue, expected COMPLETED"
[ "$(job_field "$id2" Restarts)" = 1 ] || fail "job $id2 restarted $(job_field "$id2" Restarts) times, expected 1"
S2=$RUN2/summary.json A0=$RUN2/summary.attempt0.json
[ -f "$A0" ] || fail "no summary of the first attempt ($A0)"
[ -f "$S2" ] || fail "no summary of the restart ($S2)"
stop=$(json "$A0" last_step)
[ "$(json "$A0" first_step)" = 1 ] || fail "first attempt began at step $(json "$A0" first_step)"
[ "$(json "$A0" stopped_early)" = true ] || fail "first attempt: stopped_early is not true"
[ "$stop" -ge 2 ] && [ "$stop" -lt $N2 ] || fail "first attempt stopped at step '$stop' (signal after step $seen)"
ck=$(printf '%s/ckpt/ckpt_%08d.h5' "$RUN2" "$stop")
[ -f "$ck" ] || fail "no checkpoint at the signal: $ck ($(ls "$RUN2/ckpt"))"
grep -q "caught SIGUSR1" "$out2" || fail "the trap did not report SIGUSR1"
grep -q "requeuing job $id2" "$out2" || fail "train.sbatch did not requeue"
grep -q "restart 1\]" "$out2" || fail "no log line of the restarted script (SLURM_RESTART_COUNT=1) in $out2"
grep -q "resumed from $ck at step $stop" "$out2" || fail "the restart did not resume from $ck"
[ "$(json "$S2" first_step)" = $((stop + 1)) ] && [ "$(json "$S2" last_step)" = $N2 ] \
  || fail "restart summary: steps $(json "$S2" first_step)..$(json "$S2" last_step), expected $((stop + 1))..$N2"
[ "$(json "$S2" stopped_early)" = false ] || fail "restart summary says stopped_early"
[ "$(grep -c 'srun exited with status 0' "$out2")" = 2 ] || fail "expected two srun runs with status 0 in $out2"
expect_steps "$RUN2/metrics.h5" $N2
say "   ok: signal after step $seen -> checkpoint $(basename "$ck") -> requeued (Restarts=1) -> resumed at step $((stop + 1)) -> COMPLETED, /steps = 1..$N2 once each"
fi

# ==== 3. profile.sbatch, when the program has `profile`
if part 3 && [ "${SB_SLURM_PROFILE:-auto}" != 0 ] && "$BIN" profile --help 2>&1 | grep -q -- '--output'; then
  id3=$("${SBATCH[@]}" --job-name=sbtest-profile --output="$D/profile-%j.out" \
        --export=ALL,SB_BIN=$BIN,SB_QUICK=1,SB_PROFILE=$D/profile/p.h5,SB_SET="$TINY" \
        "$SRC/jobs/slurm/profile.sbatch" configs/tiny.toml) || fail "sbatch profile.sbatch"
  id3=${id3%%;*}
  st=$(wait_job "$id3" "${SB_SLURM_TIMEOUT:-90}")
  say "3. profile.sbatch job $id3: $st, ExitCode $(job_field "$id3" ExitCode)"
  [ "$st" = COMPLETED ] || fail "profile job $id3 ended $st"
  [ -s "$D/profile/p.h5" ] && [ -s "$D/profile/p.json" ] || fail "profile job wrote no $D/profile/p.h5 / p.json"
  say "   ok: $D/profile/p.h5"
else
  say "3. skipped profile.sbatch (not in SB_SLURM_PARTS, SB_SLURM_PROFILE=0, or $BIN has no 'profile --output' yet)"
fi

# ==== 4. the study scripts: weak scaling (1 and 2 ranks) and the four-policy ablation, each one
# command; chained jobs (SB_CHAIN=1) and a report job after all of them (afterany dependency)
if part 4 && [ "${SB_SLURM_STUDIES:-1}" = 1 ]; then
  rep=0
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && rep=1
  cd "$SRC" || fail "cd $SRC"
  # SB_SLURM_STUDY_STEPS / SB_SLURM_STUDY_SET (overrides instead of the tiny ones) turn this into a measurement
  NS=${SB_SLURM_STUDY_STEPS:-3}
  common=(env SB_BIN="$BIN" SB_STEPS=$NS SB_CHAIN=1 SB_REPORT=$rep
          SB_SET="data.path=$D/data ${SB_SLURM_STUDY_SET:-$TINY} checkpoint.every=1000 log.progress=false")
  "${common[@]}" SB_RANKS="1 2" SB_TOKENS_PER_RANK=1024 jobs/slurm/weak_scaling.sh "$D/weak" > "$D/weak.submit" 2>&1 \
    || { cat "$D/weak.submit"; fail "weak_scaling.sh"; }
  "${common[@]}" SB_NTASKS=2 jobs/slurm/ablation.sh "$D/ablation" > "$D/ablation.submit" 2>&1 \
    || { cat "$D/ablation.submit"; fail "ablation.sh"; }
  cd - > /dev/null
  say "4. submitted weak_scaling.sh (2 jobs) and ablation.sh (4 jobs)$([ $rep = 1 ] && echo ', each with a report job')"
  for id in $(grep -oE 'as job [0-9]+' "$D/weak.submit" "$D/ablation.submit" | grep -oE '[0-9]+$'); do
    st=$(wait_job "$id" "${SB_SLURM_TIMEOUT:-90}")
    [ "$st" = COMPLETED ] || fail "study job $id ended $st"
    [ -n "${SB_SLURM_STUDY_STEPS:-}" ] && say "   study job $id: $st"
  done
  for f in weak/n1 weak/n2 ablation/sequential+fixed ablation/sparse+fixed ablation/sequential+dst ablation/sparse+dst; do
    [ "$(json "$D/$f.json" last_step)" = "$NS" ] || fail "$D/$f.json: last_step '$(json "$D/$f.json" last_step)', expected $NS"
  done
  [ "$(json "$D/weak/n2.json" ranks)" = 2 ] || fail "weak n2 ran on $(json "$D/weak/n2.json" ranks) ranks"
  [ "$(json "$D/ablation/sequential+dst.json" batching)" = sequential ] && \
    [ "$(json "$D/ablation/sequential+dst.json" tuning)" = dst ] || fail "ablation sequential+dst ran another policy"
  if [ $rep = 1 ]; then
    for s in weak ablation; do
      rid=$(sed -n 's/.*report job \([0-9]*\).*/\1/p' "$D/$s.submit")
      st=$(wait_job "$rid" "${SB_SLURM_TIMEOUT:-90}")
      [ "$st" = COMPLETED ] && [ -s "$D/$s/report.md" ] || { cat "$D/$s"/report-*.out; fail "$s report job $rid: $st"; }
    done
    [ -s "$D/weak/weak_speedup.png" ] && [ -s "$D/ablation/ablation.png" ] || fail "report PNGs missing"
    grep -q '^| sparse+dst |' "$D/ablation/report.md" || fail "ablation report.md has no sparse+dst row"
  fi
  say "   ok: every study job COMPLETED $NS steps with its ranks/policy$([ $rep = 1 ] && echo '; report.md + PNGs written by the report jobs')"
fi
say "PASS"
