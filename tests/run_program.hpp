// Running the built `sparsebalance` (or mpirun) from a test. The test itself runs under mpirun,
// and a child that inherited its OMPI_*/PMIX_* variables would try to join the test's MPI job,
// so children start from a clean environment with only what they need.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace sbtest {

struct Run {
  int rc;           // exit status (-1 when killed by a signal)
  std::string out;  // stdout and stderr together
};

inline std::string program() { return std::string(SB_BINARY_DIR) + "/src/sparsebalance"; }

inline std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// "env -i ..." with only PATH, HOME, the settings that let Open MPI run as root with more ranks
// than cores, one BLAS thread each, and the sanitizer settings of an SB_SANITIZE build (so
// children get the same suppressions as the test).
inline std::string clean_env() {
  const char* path = std::getenv("PATH");
  std::string env = std::string("env -i PATH=") + sh_quote(path ? path : "/usr/local/bin:/usr/bin:/bin") +
                    " HOME=/tmp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
                    " OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1 ";
  // LD_LIBRARY_PATH, OMPI_MCA_plm_rsh_agent: the GPU machine's build finds Kokkos and toml++ in an
  // unpacked prefix, and has no ssh (jobs/gpu/build_on_gpu.sh).
  for (const char* name : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "OMPI_MCA_mca_base_component_disable_dlclose",
                           "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "OMPI_MCA_plm_rsh_agent"})
    if (const char* v = std::getenv(name)) env += std::string(name) + "=" + sh_quote(v) + " ";
  return env;
}

// `cmd` is a shell command line, run in clean_env().
inline Run run_clean(const std::string& cmd) {
  std::string full = clean_env() + "sh -c " + sh_quote(cmd) + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The program with arguments, in a clean environment.
inline Run run_program(const std::string& args) { return run_clean(program() + " " + args); }

}  // namespace sbtest
