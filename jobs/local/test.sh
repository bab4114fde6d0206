#!/usr/bin/env bash
# The whole test suite: set up and build, then every ctest (units, MPI at 1/2/4 ranks,
# end-to-end training, Slurm, plots). A few minutes to a quarter hour on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash jobs/local/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd build
ctest --output-on-failure --timeout 900 "$@"
