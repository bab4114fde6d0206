// PLACEHOLDER: replaced by the real command.
#include <stdexcept>
#include "src/cli/args.hpp"
namespace sb {
Command cmd_train() {
  return {"train", "(not built yet)", "", {}, [](const Args&) -> int { throw std::runtime_error("train: not built yet"); }};
}
}  // namespace sb
