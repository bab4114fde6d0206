// The message of the sb::Error that `f` throws, or "" when it throws none. Other exceptions
// propagate (and fail the test): bad input must be reported as sb::Error, with context.
#pragma once
#include <string>

#include "base/error.hpp"

namespace sbtest {

inline std::string error_of(auto&& f) {
  try {
    f();
  } catch (const sb::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace sbtest
