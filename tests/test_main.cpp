// Test entry point: every test binary runs under mpirun (1, 2 or 4 ranks) with MPI and Kokkos up.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MPI_Init(&argc, &argv);
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
