#!/usr/bin/env bash
# The main job: set up and build, generate a long-tail synthetic corpus, train the tiny model
# on 2 MPI ranks on CPU (configs/tiny.toml: SAB + DST), evaluate it, and show where the
# checkpoint and the metrics log are. Builds only the program: about 5 minutes on 2 idle cores (README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash jobs/local/setup.sh sparsebalance  # only what the demo runs; test.sh builds the rest
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
SB=build/src/sparsebalance
RUN=runs/tiny
mkdir -p "$RUN"
if [ ! -f "$RUN/data/shard_00000.h5" ]; then
  $SB prep synth --preset longalign --docs 2000 --seed 1 --max-len 4096 --min-len 64 --output "$RUN/data"
fi
$SB inspect "$RUN/data"
rm -rf "$RUN/ckpt" "$RUN/metrics.h5"
mpirun -np 2 $SB train configs/tiny.toml --summary "$RUN/train.json"
mpirun -np 2 $SB eval configs/tiny.toml --checkpoint latest --summary "$RUN/eval.json"
$SB inspect "$RUN/metrics.h5"
echo
echo "outputs in $RUN/: data/ (shards), ckpt/ (checkpoints), metrics.h5 (log), train.json, eval.json"
echo "look inside: $SB inspect $RUN/ckpt/\$(ls $RUN/ckpt | tail -1)   or   h5dump -H $RUN/metrics.h5"
