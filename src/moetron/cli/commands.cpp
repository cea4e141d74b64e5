#include "moetron/cli/commands.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "moetron/cli/vocabulary.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron::cli {

std::string version_text(const BuildInfo& build) {
    const std::string commit = *build.git_describe != '\0'
                                   ? fmt::format(" (git {})", build.git_describe)
                                   : std::string(" (not built from a git checkout)");
    const std::string cuda = *build.cuda != '\0'
                                 ? fmt::format("yes ({})", build.cuda)
                                 : std::string("no (no nvcc found at configure time)");
    const std::string mpi =
        *build.mpi != '\0' ? fmt::format("yes ({}; distributed runs under mpirun)", build.mpi)
                           : std::string("no (no MPI found at configure time: one process only)");
    return fmt::format(
        "moetron {}{}\nbuild type: {}\nCPU backend: yes\nCUDA backend: {}\nMPI: {}\n",
        build.version, commit, build.build_type, cuda, mpi);
}

int run(int argc, char** argv, const BuildInfo& build) {
    CLI::App app{"moetron: DeepSeek-V3-class MoE pre-training engine and GPU cluster model",
                 "moetron"};
    app.require_subcommand(1);
    app.add_flag_callback(
        "--version",
        [&build] {
            MT_CHECK(
                std::fputs(version_text(build).c_str(), stdout) >= 0 && std::fflush(stdout) == 0,
                "writing the version to stdout failed: {}", detail::errno_message());
            throw CLI::Success();
        },
        "print the version, the commit and the backends (CUDA, MPI) of this build");
    register_info(app);
    register_train(app);
    register_prepare(app);
    register_sample(app);
    register_simulate(app);
    register_plan(app);
    register_export(app);
    register_import(app);
    register_calibrate(app);
    register_bench(app);
    // After every command has its options: the old names go where the new ones are.
    add_renamed_options(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help: print it, exit 0
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        // A user's mistake on the command line: one message that says what to type instead.
        throw UserError(describe_parse_error(app, e));
    }
    return 0;
}

}  // namespace moetron::cli
