// moetron import: a Hugging Face DeepSeek-V3 directory (per-expert or fused expert names, F32 or
// BF16) into a moetron checkpoint at step 0 with a fresh optimizer (checkpoint/hf_export.h), to
// train on with `moetron train --config HF_DIR --resume OUT`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "moetron/checkpoint/hf_export.h"
#include "moetron/cli/commands.h"

namespace moetron::cli {

namespace {

struct ImportOptions {
    std::string hf_dir;
    std::string out;
};

}  // namespace

void register_import(CLI::App& app) {
    auto o = std::make_shared<ImportOptions>();
    CLI::App* cmd = app.add_subcommand(
        "import", "Read a Hugging Face DeepSeek-V3 directory into a moetron checkpoint");
    cmd->add_option("--hf", o->hf_dir, "directory with config.json and model.safetensors")
        ->required();
    cmd->add_option("--out", o->out, "checkpoint root to write (step-00000000 and latest)")
        ->required();
    cmd->callback([o] {
        const auto dir = import_hf(o->hf_dir, o->out);
        std::printf("imported %s into %s\n", o->hf_dir.c_str(), dir.c_str());
    });
}

}  // namespace moetron::cli
