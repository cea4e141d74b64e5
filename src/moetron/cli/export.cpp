// moetron export: trained weights (a checkpoint, from --save or --save-final) to a Hugging
// Face DeepSeek-V3 directory (checkpoint/hf_export.h), loadable by transformers'
// DeepseekV3ForCausalLM, with a byte-level tokenizer for models whose token ids are raw bytes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moetron/checkpoint/hf_export.h"
#include "moetron/checkpoint/trained_weights.h"
#include "moetron/cli/commands.h"
#include "moetron/cli/vocabulary.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/model/params.h"
#include "moetron/train/preset_path.h"
#include "moetron/train/tokenizer.h"

namespace moetron::cli {

namespace {

struct ExportOptions {
    std::string weights;
    std::string config_path;
    std::string format = "hf";
    std::string out;
    std::string dtype = "bf16";
    std::string tokenizer;  // "": byte for a 256-token vocabulary, else none
    bool no_mtp = false;
};

void run_export(const ExportOptions& o) {
    MT_USER_CHECK(o.format == "hf", "[export] unknown --format '{}'; the one format is 'hf'",
                  o.format);
    MT_USER_CHECK(o.dtype == "bf16" || o.dtype == "fp32",
                  "[export] --dtype must be bf16 or fp32, got '{}'", o.dtype);
    MT_USER_CHECK(o.tokenizer.empty() || o.tokenizer == "byte" || o.tokenizer == "none",
                  "[export] --tokenizer must be byte or none, got '{}'", o.tokenizer);
    prepare_hf_export_dir(o.out);  // before any weights are read
    const TrainedWeightsSource source = inspect_trained_weights(o.weights);
    const std::string config_path =
        o.config_path.empty() ? std::string() : model_config_path(o.config_path);
    const ModelConfig config = trained_weights_model(source, config_path);
    const ParamTable table(model_param_specs(config));
    std::vector<float> params(static_cast<size_t>(table.total_numel()));
    read_trained_params(source, config, table.entries(), params.data());

    HfExportOptions options;
    options.dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;
    options.include_mtp = !o.no_mtp;
    options.byte_tokenizer =
        o.tokenizer.empty() ? config.vocab_size == kByteVocabSize : o.tokenizer == "byte";
    const HfExportStats s = export_hf_params(config, params.data(), o.out, options);
    std::printf("exported %lld tensors (%s%s, %.1f MiB) to %s%s\n",
                static_cast<long long>(s.num_tensors), o.dtype.c_str(),
                options.include_mtp ? "" : ", without MTP",
                static_cast<double>(s.num_bytes) / (1024.0 * 1024.0), o.out.c_str(),
                options.byte_tokenizer ? ", with a byte-level tokenizer (token id = byte)" : "");
}

}  // namespace

void register_export(CLI::App& app) {
    auto o = std::make_shared<ExportOptions>();
    CLI::App* cmd = app.add_subcommand(
        "export",
        "Write trained weights as a Hugging Face DeepSeek-V3 directory (config.json, "
        "model.safetensors and its index, and a tokenizer for byte-level models)");
    cmd->add_option("--weights", o->weights,
                    "a checkpoint directory or root (train --save or --save-final)")
        ->required();
    cmd->add_option("--config", o->config_path,
                    "optional: the model the checkpoint must hold, a preset name or a TOML file "
                    "(a checkpoint knows its model)");
    cmd->add_option("--format", o->format, "output format")->capture_default_str();
    cmd->add_option("--out", o->out, "output directory (created if needed)")->required();
    cmd->add_option("--dtype", o->dtype, "bf16 (the default) or fp32")->capture_default_str();
    cmd->add_flag("--no-mtp", o->no_mtp,
                  "leave out the multi-token-prediction module (transformers does not run it "
                  "and reports its weights as unexpected)");
    cmd->add_option("--tokenizer", o->tokenizer,
                    "byte: write tokenizer.json mapping each byte to its token id; none: no "
                    "tokenizer (default: byte when the vocabulary is the 256 bytes)");
    cmd->callback([o] { run_export(*o); });
}

}  // namespace moetron::cli
