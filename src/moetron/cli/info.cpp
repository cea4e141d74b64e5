// moetron info: what a model config costs. Parameter counts by part, FLOPs per token in
// Megatron-LM's convention (model/flops.h), and the memory of fp32 training state.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/cli/vocabulary.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"

namespace moetron::cli {

namespace {

struct InfoOptions {
    std::string config_path;
    int64_t seq_len = 4096;  // DeepSeek-V3's pre-training length
    bool json = false;
};

// fp32 master weights, fp32 gradients, AdamW's first and second moments: 4 x 4 bytes.
constexpr double kFp32AdamWBytesPerParam = 16.0;

// Engineering notation, exponent a multiple of 3, for counts that span 1e3 to 1e12.
std::string engineering(double value) {
    int exponent = 0;
    while (std::abs(value) >= 1000.0 && exponent < 15) value /= 1000.0, exponent += 3;
    return exponent == 0 ? fmt::format("{:.0f}", value) : fmt::format("{:.3f}e{}", value, exponent);
}

std::string gibibytes(double bytes) {
    return fmt::format("{:.3f} GiB", bytes / (1u << 30));
}

nlohmann::json config_json(const ModelConfig& c) {
    nlohmann::json j = model_config_to_json(c);
    j["num_dense_layers"] = c.num_dense_layers();
    j["num_moe_layers"] = c.num_moe_layers();
    return j;
}

nlohmann::json params_json(const ParamCounts& p) {
    return {
        {"embedding", p.embedding},
        {"output_head", p.output_head},
        {"final_norm", p.final_norm},
        {"attention", p.attention},
        {"dense_mlp", p.dense_mlp},
        {"moe_shared", p.moe_shared},
        {"moe_routed", p.moe_routed},
        {"router", p.router},
        {"layer_norms", p.layer_norms},
        {"mtp", p.mtp},
        {"total", p.total},
        {"active", p.active},
        {"routed_expert_single", p.routed_expert_single},
    };
}

nlohmann::json flops_json(const FlopsPerToken& f) {
    return {
        {"attention_linear", f.attention_linear},
        {"attention_core", f.attention_core},
        {"dense_mlp", f.dense_mlp},
        {"moe_shared", f.moe_shared},
        {"moe_routed", f.moe_routed},
        {"logits", f.logits},
        {"mtp", f.mtp},
        {"total", f.total},
    };
}

void run_info(const InfoOptions& options) {
    const ModelConfig config = load_model_config(model_config_path(options.config_path));
    const ParamCounts params = count_parameters(config);
    const FlopsPerToken flops = flops_per_token(config, options.seq_len, /*include_mtp=*/true);
    const FlopsPerToken flops_no_mtp =
        flops_per_token(config, options.seq_len, /*include_mtp=*/false);
    // The MTP module is trained with the model, so its state is part of the training memory.
    const double memory_bytes = kFp32AdamWBytesPerParam * (params.total + params.mtp);

    if (options.json) {
        const nlohmann::json out = {
            {"config", config_json(config)},  {"seq_len", options.seq_len},
            {"params_total", params.total},   {"params_mtp", params.mtp},
            {"params_active", params.active}, {"params", params_json(params)},
            {"flops_per_token", flops.total}, {"flops_per_token_no_mtp", flops_no_mtp.total},
            {"flops", flops_json(flops)},     {"memory_fp32_adamw_bytes", memory_bytes},
        };
        std::printf("%s\n", out.dump(2).c_str());
        return;
    }

    auto line = [](std::string_view label, double value, double of_total) {
        fmt::print("  {:<24}{:>12}  {:5.1f}%\n", label, engineering(value),
                   100.0 * value / of_total);
    };
    std::printf("%s\n\n", describe_model_config(config).c_str());
    fmt::print("parameters: {} total (main model), {} in MTP, {} active per token\n",
               engineering(params.total), engineering(params.mtp), engineering(params.active));
    line("embedding", params.embedding, params.total);
    line("output head", params.output_head, params.total);
    line("attention (MLA)", params.attention, params.total);
    line("dense MLPs", params.dense_mlp, params.total);
    line("shared experts", params.moe_shared, params.total);
    line("routed experts", params.moe_routed, params.total);
    line("routers", params.router, params.total);
    line("norms", params.layer_norms + params.final_norm, params.total);
    fmt::print("  {:<24}{:>12}\n", "one routed expert", engineering(params.routed_expert_single));

    fmt::print(
        "\nFLOPs per token at seq {} (forward + backward, Megatron-LM convention): {} with MTP, "
        "{} without\n",
        options.seq_len, engineering(flops.total), engineering(flops_no_mtp.total));
    line("attention projections", flops.attention_linear, flops.total);
    line("attention core", flops.attention_core, flops.total);
    line("dense MLPs", flops.dense_mlp, flops.total);
    line("shared experts", flops.moe_shared, flops.total);
    line("routed experts (top-k)", flops.moe_routed, flops.total);
    line("logits", flops.logits, flops.total);
    line("MTP", flops.mtp, flops.total);

    fmt::print("\nmemory for fp32 params + grads + AdamW moments (16 B/param, with MTP): {}\n",
               gibibytes(memory_bytes));
}

}  // namespace

void register_info(CLI::App& app) {
    auto options = std::make_shared<InfoOptions>();
    CLI::App* info = app.add_subcommand(
        "info", "Print a model config's parameter counts, FLOPs per token and training memory");
    info->add_option("--config", options->config_path,
                     "model: a preset name (tiny, small, dsv3-671b), a TOML file, or a HF "
                     "config.json (or its directory)")
        ->required();
    info->add_option("--seq-len", options->seq_len, "tokens per sequence, for the attention FLOPs")
        ->capture_default_str()
        ->check(whole_number(1, int64_t{1} << 24));
    add_renamed_option(*info, "--seq", "--seq-len");
    info->add_flag("--json", options->json, "print one JSON object instead of the table");
    info->callback([options] { run_info(*options); });
}

}  // namespace moetron::cli
