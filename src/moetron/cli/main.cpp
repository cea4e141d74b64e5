// moetron: the command-line entry point. Each subcommand lives in its own cli/*.cpp file and
// registers through cli/commands.h; main only dispatches and turns exceptions into a message.
#include <cstdio>
#include <exception>
#include <string_view>

#include "moetron/cli/commands.h"

int main(int argc, char** argv) {
    try {
        return moetron::cli::run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetron: error: %s\n", e.what());
        return 1;
    }
}
