// PLACEHOLDER: replaced by the real command.
#include <stdexcept>
#include "src/cli/args.hpp"
namespace sb {
Command cmd_simulate() {
  return {"simulate", "(not built yet)", "", {}, [](const Args&) -> int { throw std::runtime_error("simulate: not built yet"); }};
}
}  // namespace sb
