// sparsebalance: one program, one subcommand per job (DESIGN.md, "Command line").
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <Kokkos_Core.hpp>

#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "base/error.hpp"

namespace {

void print_overview() {
  std::printf("usage: sparsebalance COMMAND [CONFIG.toml] [--set key=value]... [--summary PATH] [options]\n\n");
  std::printf("Trains transformer language models on long, variable-length sequences with block-sparse\n");
  std::printf("attention, balanced across MPI ranks. Launch with mpirun/srun; one rank is a valid run.\n\n");
  std::printf("commands:\n");
  for (const auto& c : sb::commands()) std::printf("  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n`sparsebalance COMMAND --help` for each command's options. Docs: README.md.\n");
}

int rank_of_world() {
  int inited = 0, rank = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_overview();
    return argc < 2 ? 2 : 0;
  }
  const sb::Command* cmd = nullptr;
  for (const auto& c : sb::commands())
    if (c.name == argv[1]) cmd = &c;
  if (!cmd) {
    std::fprintf(stderr, "sparsebalance: unknown command '%s'\n\n", argv[1]);
    print_overview();
    return 2;
  }
  try {
    sb::Args args = sb::parse_args(std::span<char* const>(argv + 2, argc - 2), cmd->flags,
                                   "sparsebalance " + cmd->name);
    if (args.help) {
      std::printf("usage: sparsebalance %s\n\n%s\n%s", cmd->name.c_str(), cmd->usage.c_str(),
                  sb::flags_help(cmd->flags).c_str());
      return 0;
    }
    sb::MpiSession mpi(&argc, &argv);
    Kokkos::ScopeGuard kokkos;
    return cmd->run(args);
  } catch (const std::exception& e) {
    int size = 1, inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::fprintf(stderr, "sparsebalance %s: error%s: %s\n", cmd->name.c_str(),
                 size > 1 ? (" on rank " + std::to_string(rank_of_world())).c_str() : "", e.what());
    std::fflush(stderr);
    // One rank's failure must end the whole job, not leave the others waiting in a collective.
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
