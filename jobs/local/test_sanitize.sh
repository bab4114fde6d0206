#!/usr/bin/env bash
# The test suite again, built with AddressSanitizer + UBSan (SB_SANITIZE=ON) into ./build-asan:
# every ctest except the Slurm one (it runs the same programs under slurmd; the plain suite covers
# it) and the programs and cases tests/*/CMakeLists.txt mark PLAIN_ONLY / SANITIZED_SKIP (timing and
# repetition: kill -9 at random moments, convergence runs). Any ASan, UBSan or LeakSanitizer report fails the test that triggered it. Children started
# by the tests (mpirun, the sparsebalance CLI) get the same settings. Extra args go to ctest.
#   bash jobs/local/test_sanitize.sh            (after jobs/local/setup.sh has installed the packages)
# -g1: line tables only, enough for the reports' file:line, and a quarter faster to compile than -g.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DSB_SANITIZE=ON -DSB_BENCH=OFF \
  -DSB_CUDA=OFF >/dev/null
cmake --build build-asan -j "$(nproc)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI's plugins stay loaded so LSan can name the library of their allocations, which
# tests/lsan.supp then suppresses (MPI/HDF5 state kept until exit, by design).
export OMPI_MCA_mca_base_component_disable_dlclose=1
# intercept_tls_get_addr=0: LSan's tracking of dynamic TLS takes a glibc >= 2.25 TLS block for a
# 2.19 header when its offset in the page happens to match (google/sanitizers#1322) and then scans
# a bogus range at exit ("Tracer caught signal 11"); on Debian 12 (glibc 2.36-9+deb12u14) this hit
# `sparsebalance keys --markdown` every time. Static TLS and every thread's stack are still scanned.
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=0:halt_on_error=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
cd build-asan
ctest -j "$(nproc)" --output-on-failure --timeout 1800 -LE slurm "$@"
