// moetron export: a training checkpoint to a Hugging Face DeepSeek-V3 directory
// (train/hf_export.h), loadable by transformers' DeepseekV3ForCausalLM.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "moetron/cli/commands.h"
#include "moetron/core/error.h"
#include "moetron/train/hf_export.h"

namespace moetron::cli {

namespace {

struct ExportOptions {
    std::string checkpoint;
    std::string format = "hf";
    std::string out;
    std::string dtype = "bf16";
};

void run_export(const ExportOptions& o) {
    MT_CHECK(o.format == "hf", "[export] unknown --format '{}'; the one format is 'hf'", o.format);
    MT_CHECK(o.dtype == "bf16" || o.dtype == "fp32",
             "[export] --dtype must be bf16 or fp32, got '{}'", o.dtype);
    const HfExportStats s =
        export_hf(o.checkpoint, o.out, o.dtype == "bf16" ? DType::bf16 : DType::f32);
    std::printf("exported %lld tensors (%s, %.1f MiB) to %s\n",
                static_cast<long long>(s.num_tensors), o.dtype.c_str(),
                static_cast<double>(s.num_bytes) / (1024.0 * 1024.0), o.out.c_str());
}

}  // namespace

void register_export(CLI::App& app) {
    auto o = std::make_shared<ExportOptions>();
    CLI::App* cmd = app.add_subcommand(
        "export",
        "Write a checkpoint as a Hugging Face DeepSeek-V3 directory (config.json, "
        "model.safetensors and its index)");
    cmd->add_option("--checkpoint", o->checkpoint,
                    "checkpoint directory, or a checkpoint root (its `latest`)")
        ->required();
    cmd->add_option("--format", o->format, "output format")->capture_default_str();
    cmd->add_option("--out", o->out, "output directory (created if needed)")->required();
    cmd->add_option("--dtype", o->dtype, "bf16 or fp32")->capture_default_str();
    cmd->callback([o] { run_export(*o); });
}

}  // namespace moetron::cli
