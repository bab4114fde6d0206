// Test entry point: every test binary runs under mpirun (1, 2 or 4 ranks) with MPI and Kokkos up.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MPI_Init(&argc, &argv);
  // SB_TEST_TMP (tests/CMakeLists.txt): this test's own temporary directory, so tests that ctest -j
  // runs side by side never share a file. Set only after MPI_Init: MPI's session files stay in the
  // system's, and the path is short enough for the sockets of an mpirun a test starts.
  if (const char* tmp = std::getenv("SB_TEST_TMP"); tmp && *tmp) {
    std::error_code ec;
    std::filesystem::create_directories(tmp, ec);
    if (ec) {
      std::fprintf(stderr, "test_main: cannot create SB_TEST_TMP=%s: %s\n", tmp, ec.message().c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    setenv("TMPDIR", tmp, 1);
  }
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    rc = RUN_ALL_TESTS();
  }
  // A failure on any rank fails the run on every rank, so mpirun reports it whichever rank saw it.
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
