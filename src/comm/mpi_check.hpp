// MPI: any return other than MPI_SUCCESS throws sb::Error, naming the call and the source line
// (MpiSession sets MPI_ERRORS_RETURN, so failures come back as codes).
#pragma once
#include <string>

#include "base/error.hpp"

#define MPI_CHECK(call) \
  SB_CHECK_CALL("MPI", call, sb_rc_, sb_rc_ == 0, "error code " + std::to_string(sb_rc_))
