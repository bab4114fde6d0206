// The ground floor: errors with context, for every part of the program (no MPI, TOML or CLI here).
// The check macros of each library call fail_call(): SB_CUDA_CHECK (base/cuda_check.hpp),
// SB_CUBLAS_CHECK (kernels/cuda/cuda_check.hpp), SB_NCCL_CHECK (src/comm/nccl_cuda.cpp),
// MPI_CHECK (src/comm/mpi_check.hpp), H5_CHECK (io/h5.hpp).
#pragma once
#include <stdexcept>
#include <string>

namespace sb {

// Every user-facing failure is an sb::Error whose message names the file, field or flag at fault.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws sb::Error "<what> call failed at <file>:<line>: <call> (<detail>)".
[[noreturn]] void fail_call(const char* what, const char* call, const char* file, int line,
                            const std::string& detail = {});

}  // namespace sb

// The shape of every check macro: evaluate `call` once into `r`; unless `ok` (an expression of r)
// holds, fail_call(what, "<call>", file, line, detail) (detail: an expression of r).
#define SB_CHECK_CALL(what, call, r, ok, detail)                                  \
  do {                                                                            \
    auto r = (call);                                                              \
    if (!(ok)) ::sb::fail_call(what, #call, __FILE__, __LINE__, detail);          \
  } while (0)
