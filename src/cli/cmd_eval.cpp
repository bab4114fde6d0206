// PLACEHOLDER: replaced by the real command.
#include <stdexcept>
#include "src/cli/args.hpp"
namespace sb {
Command cmd_eval() {
  return {"eval", "(not built yet)", "", {}, [](const Args&) -> int { throw std::runtime_error("eval: not built yet"); }};
}
}  // namespace sb
