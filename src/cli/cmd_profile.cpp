// PLACEHOLDER: replaced by the real command.
#include <stdexcept>
#include "src/cli/args.hpp"
namespace sb {
Command cmd_profile() {
  return {"profile", "(not built yet)", "", {}, [](const Args&) -> int { throw std::runtime_error("profile: not built yet"); }};
}
}  // namespace sb
