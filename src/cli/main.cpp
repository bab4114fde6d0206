// sparsebalance: one program, one subcommand per job (DESIGN.md, "Command line").
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string>

#include <Kokkos_Core.hpp>

#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "base/error.hpp"
#include "src/train/trainer.hpp"

namespace {

void print_overview() {
  std::printf("usage: sparsebalance COMMAND [CONFIG.toml] [--set key=value]... [--summary PATH] [options]\n\n");
  std::printf("Trains transformer language models on long, variable-length sequences with block-sparse\n");
  std::printf("attention, balanced across MPI ranks. Launch with mpirun/srun; one rank is a valid run.\n\n");
  std::printf("commands:\n");
  for (const auto& c : sb::commands()) std::printf("  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n`sparsebalance COMMAND --help` for each command's options. Docs: README.md.\n");
}

struct World {
  int rank = 0, size = 1;
};
World world() {  // rank 0 of 1 before MPI_Init and after MPI_Finalize
  int inited = 0, finalized = 0;
  World w;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  return w;
}

const char* g_cmd = "";

std::string what_of(std::exception_ptr ep) {
  try {
    if (ep) std::rethrow_exception(ep);
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc): the model, the data or an input is larger than this rank's memory";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return "unknown error";
}

void print_error(const std::string& what) {
  const World w = world();
  std::fprintf(stderr, "sparsebalance %s: error%s: %s\n", g_cmd,
               w.size > 1 ? (" on rank " + std::to_string(w.rank)).c_str() : "", what.c_str());
  std::fflush(stderr);
}

// With more than one rank an exception is never caught: no handler means no unwinding, so no
// destructor (MPI_Finalize, a communicator, a GPU context) can wait for ranks that are stuck in a
// collective. std::terminate lands here, prints the error naming the rank and ends the whole job.
[[noreturn]] void abort_job() {
  print_error(what_of(std::current_exception()));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

// SIGUSR1/SIGTERM from the first instant of a train job (a scheduler may preempt it while MPI
// starts): the run finishes the step it is in, checkpoints and exits 0. Async-signal-safe.
void on_stop_signal(int sig) { sb::g_stop_signal.store(sig); }

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
  g_cmd = cmd->name.c_str();
  if (cmd->name == "train") {
    std::signal(SIGUSR1, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
  }
  sb::Args args;
  try {
    args = sb::parse_args(std::span<char* const>(argv + 2, argc - 2), cmd->flags, "sparsebalance " + cmd->name,
                          cmd->common);
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
  if (args.help) {
    std::printf("usage: sparsebalance %s\n\n%s\n%s", cmd->name.c_str(), cmd->usage.c_str(),
                sb::flags_help(cmd->flags, cmd->common).c_str());
    return 0;
  }
  // MPI and Kokkos outlive every error path: MpiSession's MPI_Finalize must never run while
  // another rank still waits for this one (it would wait too, and the job would hang).
  std::optional<sb::MpiSession> mpi;
  try {
    mpi.emplace(&argc, &argv);
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
  const bool many = world().size > 1;
  if (many) std::set_terminate(abort_job);
  Kokkos::ScopeGuard kokkos;
  if (many) return cmd->run(args);  // an exception here: abort_job, above
  try {
    return cmd->run(args);
  } catch (...) {
    print_error(what_of(std::current_exception()));
    return 1;
  }
}
