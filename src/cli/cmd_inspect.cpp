// PLACEHOLDER: replaced by the real command.
#include <stdexcept>
#include "src/cli/args.hpp"
namespace sb {
Command cmd_inspect() {
  return {"inspect", "(not built yet)", "", {}, [](const Args&) -> int { throw std::runtime_error("inspect: not built yet"); }};
}
}  // namespace sb
