// moetron: the command-line entry point. Each subcommand lives in its own cli/*.cpp file and
// registers through cli/commands.h; main only dispatches, turns exceptions into a message and
// hands run() what the build generated for --version (moetron_build_info.h).
#include <cstdio>
#include <exception>
#include <string_view>

#include "moetron/cli/commands.h"
#include "moetron_build_info.h"  // generated in the build directory

int main(int argc, char** argv) {
    try {
        moetron::cli::BuildInfo build;
        build.version = MOETRON_BUILD_VERSION;
        build.git_describe = MOETRON_BUILD_GIT_DESCRIBE;
        build.build_type = MOETRON_BUILD_TYPE;
        build.cuda = MOETRON_BUILD_CUDA;
        build.mpi = MOETRON_BUILD_MPI;
        return moetron::cli::run(argc, argv, build);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetron: error: %s\n", e.what());
        return 1;
    }
}
