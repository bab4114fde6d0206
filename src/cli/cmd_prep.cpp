// PLACEHOLDER: replaced by the real command.
#include <stdexcept>
#include "src/cli/args.hpp"
namespace sb {
Command cmd_prep() {
  return {"prep", "(not built yet)", "", {}, [](const Args&) -> int { throw std::runtime_error("prep: not built yet"); }};
}
}  // namespace sb
