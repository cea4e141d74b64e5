#include "moetron/cli/commands.h"

#include <CLI/CLI.hpp>

#include "moetron/cli/vocabulary.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron::cli {

int run(int argc, char** argv) {
    CLI::App app{"moetron: DeepSeek-V3-class MoE pre-training engine and GPU cluster model",
                 "moetron"};
    app.require_subcommand(1);
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
