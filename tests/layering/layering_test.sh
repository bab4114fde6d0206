#!/usr/bin/env bash
# The arrows that must never exist (issue 17; the map is in src/README.md), checked on the
# includes of every source file: a room may not include a header of a room above it.
#   base/        the ground floor: nothing of the project, no MPI, HDF5, TOML, JSON, Kokkos
#   kernels/     know nothing above them: nothing from src/ or io/, no MPI
#   io/          knows neither the loop nor the balancer: nothing from src/ or kernels/
#   src/balance  plans on costs, never tensors, and makes no MPI call: no kernels/, src/model,
#                src/train, src/comm, src/config (its options come as values), mpi.h
#   src/model    neither saves itself nor communicates: no io/, src/comm, src/train, src/balance,
#                src/config, mpi.h, nccl.h
#   src/comm     no kernels/ (the CUDA check is base/cuda_check.hpp), nothing above it
#   src/parts    context parallelism (documents in parts over rank groups): nothing from the engine,
#                the trainer, hf, the CLI, and no config, io or data
#   src/stats    what the steps measured (step statistics, the run summary): no engine, parts,
#                trainer, hf, CLI, config, data or kernels
#   src/engine   runs what it is given (compute, reduce, update): no trainer, hf, CLI, config, io,
#                data or balancer (the plan is made above it)
#   src/train    the step: no eval, hf, CLI
#   src/eval     evaluation (eval, eval --diagnose): no hf, CLI, config or data (the trainer's
#                settings and packing come from src/train)
#   src/hf       Hugging Face conversion: no CLI, eval, engine, parts, comm, balancer or data
# usage: tests/layering/layering_test.sh SOURCE_DIR
set -u
src=${1:?usage: layering_test.sh SOURCE_DIR}
cd "$src" || exit 2
bad=0
# forbid DIR REGEX WHY: no #include in DIR (its sources and headers) may match REGEX.
forbid() {
  local dir=$1 re=$2 why=$3 hits
  [ -d "$dir" ] || return 0
  hits=$(grep -rnE --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh' \
         "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($re)" "$dir")
  if [ -n "$hits" ]; then
    echo "layering: $dir must not include $re ($why):"
    echo "$hits" | sed 's/^/  /'
    bad=1
  fi
}
forbid base 'src/|io/|kernels/|mpi\.h|hdf5\.h|toml|nlohmann|Kokkos' "the ground floor links nothing but the C++ runtime"
forbid kernels 'src/|io/|mpi\.h' "kernels know nothing above them"
forbid io 'src/|kernels/' "io knows neither the training loop nor the balancer"
forbid src/balance 'kernels/|src/model/|src/parts/|src/engine/|src/train/|src/eval/|src/hf/|src/comm/|src/config/|mpi\.h' "balance plans on costs, never tensors, from values; its exchange is a function passed in"
forbid src/model 'io/|src/comm/|src/parts/|src/engine/|src/train/|src/eval/|src/hf/|src/balance/|src/config/|mpi\.h|nccl\.h' "the model neither saves itself nor communicates, and reads no config"
forbid src/comm 'kernels/|io/|src/balance/|src/model/|src/parts/|src/engine/|src/train/|src/eval/|src/hf/' "comm carries bytes for the rooms above it"
forbid src/data 'kernels/|src/model/|src/balance/|src/parts/|src/engine/|src/train/|src/eval/|src/hf/|src/cli/|src/comm/|src/config/' "data prepares and reads token files"
forbid src/parts 'io/|src/data/|src/config/|src/engine/|src/train/|src/eval/|src/hf/|src/cli/' "context parallelism splits documents and moves their rows; the engine and the trainer use it"
forbid src/stats 'kernels/|src/data/|src/config/|src/parts/|src/engine/|src/train/|src/eval/|src/hf/|src/cli/' "statistics are numbers the trainer hands in and the log records"
forbid src/engine 'io/|src/data/|src/config/|src/balance/|src/train/|src/eval/|src/hf/|src/cli/' "the engine runs what it is given; the settings it needs come as EngineSettings"
forbid src/train 'src/eval/|src/hf/|src/cli/' "the step knows nothing of evaluation, the conversion or the command line"
forbid src/eval 'src/hf/|src/cli/|src/data/|src/config/' "evaluation runs the trainer's settings and packing on an engine; it reads no config and prepares no data"
forbid src/hf 'src/cli/|src/eval/|src/engine/|src/parts/|src/comm/|src/balance/|src/data/' "the conversion maps files to files, through the model's layout"
[ $bad = 0 ] && echo "layering: ok"
exit $bad
