// Errors with context, and the check macros that name file and line for every MPI/HDF5 call.
#pragma once
#include <stdexcept>
#include <string>

namespace sb {

// Every user-facing failure is an sb::Error whose message names the file, field or flag at fault.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail_call(const char* what, const char* call, const char* file, int line,
                            const std::string& detail = {});

}  // namespace sb

// MPI: any return other than MPI_SUCCESS throws, naming the call and the source line.
#define MPI_CHECK(call)                                                               \
  do {                                                                                \
    int sb_rc_ = (call);                                                              \
    if (sb_rc_ != 0) ::sb::fail_call("MPI", #call, __FILE__, __LINE__,                \
                                     "error code " + std::to_string(sb_rc_));         \
  } while (0)

// HDF5: negative ids/status are failures.
#define H5_CHECK(call)                                                                \
  ([&]() {                                                                            \
    auto sb_rc_ = (call);                                                             \
    if (sb_rc_ < 0) ::sb::fail_call("HDF5", #call, __FILE__, __LINE__);               \
    return sb_rc_;                                                                    \
  }())
