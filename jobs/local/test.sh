#!/usr/bin/env bash
# The whole test suite: set up and build, then every ctest (units, MPI at 1/2/4 ranks,
# end-to-end training, reliability, Slurm, plots), after running each libFuzzer target briefly
# (SB_FUZZ_SECONDS each, default 20; 0 skips); then the same tests built with ASan + UBSan
# (jobs/local/test_sanitize.sh; SB_SANITIZE_TESTS=0 skips). About 36 minutes on 2 cores.
# Arguments go to ctest and run only the plain suite (e.g. -R test_config, -L mpi).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash jobs/local/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if [ "${SB_FUZZ_SECONDS:-20}" != 0 ] && [ $# -eq 0 ]; then
  SB_FUZZ_JOBS=$(nproc) bash tests/fuzz/run_fuzz.sh all "${SB_FUZZ_SECONDS:-20}"
fi
(cd build && ctest -j "$(nproc)" --output-on-failure --timeout 900 "$@")
if [ "${SB_SANITIZE_TESTS:-1}" != 0 ] && [ $# -eq 0 ]; then
  bash jobs/local/test_sanitize.sh
fi
