// The subcommand table. Each command lives in src/cli/cmd_<name>.cpp.
#include "src/cli/args.hpp"

namespace sb {

Command cmd_prep();
Command cmd_inspect();
Command cmd_train();
Command cmd_eval();
Command cmd_profile();
Command cmd_simulate();
Command cmd_keys();
Command cmd_convert();
Command cmd_generate();
Command cmd_memory();

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {cmd_prep(),    cmd_train(),   cmd_eval(),     cmd_profile(),
                                           cmd_simulate(), cmd_inspect(), cmd_convert(), cmd_generate(),
                                           cmd_memory(),  cmd_keys()};
  return all;
}

}  // namespace sb
