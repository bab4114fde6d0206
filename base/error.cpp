#include "base/error.hpp"

namespace sb {

void fail_call(const char* what, const char* call, const char* file, int line,
               const std::string& detail) {
  std::string msg = std::string(what) + " call failed at " + file + ":" + std::to_string(line) +
                    ": " + call;
  if (!detail.empty()) msg += " (" + detail + ")";
  throw Error(msg);
}

}  // namespace sb
