#include "moetron/cli/commands.h"

#include <CLI/CLI.hpp>

namespace moetron::cli {

int run(int argc, char** argv) {
    CLI::App app{"moetron: DeepSeek-V3-class MoE pre-training engine and GPU cluster model"};
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
    CLI11_PARSE(app, argc, argv);
    return 0;
}

}  // namespace moetron::cli
