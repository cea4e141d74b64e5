// The subcommands of the moetron binary. Each lives in its own file and adds itself to the
// CLI11 app through one register_* function listed in commands.cpp.
#pragma once

namespace CLI {
class App;
}

namespace moetron::cli {

// Parses argv, runs the chosen subcommand, returns the process exit code.
int run(int argc, char** argv);


}  // namespace moetron::cli
