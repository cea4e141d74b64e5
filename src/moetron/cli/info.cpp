// moetron info: what a model config costs. Parameter counts by part, FLOPs per token in
// Megatron-LM's convention (model/flops.h), and the memory of fp32 training state.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/cli/vocabulary.h"
#include "moetron/core/checked_math.h"
#include "moetron/core/precision.h"
#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/model.h"
#include "moetron/parallel/layout.h"
#include "moetron/parallel/topology.h"
#include "moetron/train/run_plan.h"

namespace moetron::cli {

namespace {

struct InfoOptions {
    std::string config_path;
    int64_t seq_len = 4096;  // DeepSeek-V3's pre-training length
    bool json = false;
    // The per-rank memory plan (plan_rank_memory): the layout and the MoE knobs of `train`.
    std::string layout;
    int ranks = 0;           // 0: tp * cp * pp * dp of the layout (ep for dp when left out)
    int64_t batch_size = 1;  // sequences per micro-batch on one rank
    int domain_size = 0;
    std::string dispatch = "flat";
    std::string moe_overlap = "off";
    double moe_capacity_factor = parallel::kDefaultMoeCapacityFactor;
    int64_t redundant_experts = 0;
    // The recipe and the dispatch payload: the dispatched tokens' format sizes the exchange
    // buffers.
    std::string precision = "fp32";
    parallel::DispatchPayload dispatch_payload = parallel::DispatchPayload::recipe;
};

// The plan of options.layout (train/run_plan.h, as `train` makes it) and the planned memory of
// one of its ranks, as the engine's planners size it.
struct RankMemory {
    RunPlan plan;
    TrainConfig train;
    RankMemoryPlan memory;
};

RankMemory plan_memory(const InfoOptions& o, const ModelConfig& config) {
    const parallel::Layout layout = parallel::parse_layout(o.layout);
    // Without --ranks: the attention side's ranks when dp is given, else tp * ep (one replica
    // of an expert group, as many of tp); checked so that the sizes of a typo cannot wrap.
    const int64_t default_ranks =
        layout.dp > 0 ? checked_product<int64_t>({layout.tp, layout.cp, layout.pp, layout.dp},
                                                 "--layout ranks")
                      : checked_product<int64_t>({layout.tp, layout.cp, layout.pp, layout.ep},
                                                 "--layout ranks");
    MT_USER_CHECK(o.ranks > 0 || default_ranks <= std::numeric_limits<int>::max(),
                  "--layout {} needs {} ranks, more than a job can have", o.layout, default_ranks);
    const int ranks = o.ranks > 0 ? o.ranks : static_cast<int>(default_ranks);
    RunSettings settings;
    settings.layout = o.layout;
    settings.domain_size = o.domain_size;
    settings.moe.dispatch = parallel::parse_dispatch_kind(o.dispatch);
    settings.moe.overlap = parse_moe_overlap(o.moe_overlap);
    settings.moe.capacity_factor = o.moe_capacity_factor;
    settings.moe.redundant_experts = o.redundant_experts;
    settings.precision = parse_precision(o.precision);
    settings.dispatch_payload = o.dispatch_payload;
    RankMemory m;
    // --batch-size is one rank's micro-batch: the run's is dp of them.
    m.train.seq_len = o.seq_len;
    m.train.batch_size = o.batch_size * plan_topology(settings, ranks).dp;
    m.plan = plan_run(config, m.train, settings, ranks);
    m.memory = plan_run_memory(config, m.train, m.plan);
    return m;
}

nlohmann::json memory_json(const RankMemory& m) {
    const RankMemoryPlan& p = m.memory;
    return {
        {"layout", m.plan.topology.str()},
        {"parameters", p.parameters},
        {"gradients", p.gradients},
        {"optimizer_state", p.optimizer_state},
        {"activations", p.activations},
        {"expert_side_buffers", p.expert_side},
        {"communication_buffers", p.communication},
        {"total", p.parameters + p.gradients + p.optimizer_state + p.activations + p.expert_side +
                      p.communication},
        {"expert_rows_per_layer", p.expert_rows},
        {"worst_case_expert_rows_per_layer", p.worst_case_expert_rows},
    };
}

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
    // A run can train no longer sequences than the model has positions: then there is no plan.
    const bool plannable = options.seq_len <= config.max_position_embeddings;
    const std::optional<RankMemory> rank_memory =
        plannable ? std::optional<RankMemory>(plan_memory(options, config)) : std::nullopt;

    if (options.json) {
        const nlohmann::json out = {
            {"config", config_json(config)},
            {"seq_len", options.seq_len},
            {"params_total", params.total},
            {"params_mtp", params.mtp},
            {"params_active", params.active},
            {"params", params_json(params)},
            {"flops_per_token", flops.total},
            {"flops_per_token_no_mtp", flops_no_mtp.total},
            {"flops", flops_json(flops)},
            {"memory_fp32_adamw_bytes", memory_bytes},
            {"memory_per_rank_bytes",
             rank_memory ? memory_json(*rank_memory) : nlohmann::json(nullptr)},
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

    if (!rank_memory) {
        fmt::print(
            "\nplanned memory per rank: none at seq {}, longer than the model's {} positions "
            "(a run refuses it; pass --seq-len {} or less)\n",
            options.seq_len, config.max_position_embeddings, config.max_position_embeddings);
        return;
    }
    const RankMemoryPlan& p = rank_memory->memory;
    const double total = static_cast<double>(p.parameters + p.gradients + p.optimizer_state +
                                             p.activations + p.expert_side + p.communication);
    fmt::print(
        "\nplanned memory per rank ({}, {} x {} tokens per micro-batch, fp32, as the engine's "
        "arenas): {}\n",
        rank_memory->plan.topology.str(), options.batch_size, options.seq_len, gibibytes(total));
    auto bytes_line = [total](std::string_view label, size_t bytes) {
        fmt::print("  {:<24}{:>14}  {:5.1f}%\n", label, gibibytes(static_cast<double>(bytes)),
                   100.0 * static_cast<double>(bytes) / total);
    };
    bytes_line("parameters", p.parameters);
    bytes_line("gradients", p.gradients);
    bytes_line("optimizer state", p.optimizer_state);
    bytes_line("activations", p.activations);
    bytes_line("expert-side buffers", p.expert_side);
    bytes_line("communication buffers", p.communication);
    if (config.n_routed_experts > 0)
        fmt::print("  expert-side rows per MoE layer: {} (capacity factor {:g}; worst case {})\n",
                   p.expert_rows, options.moe_capacity_factor, p.worst_case_expert_rows);
    // The plan as `train` prints it.
    for (const std::string& plan_line : describe_run_plan(rank_memory->plan, rank_memory->train))
        fmt::print("{}\n", plan_line);
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
    info->add_flag("--json", options->json, "print one JSON object instead of the table");
    info->add_option("--layout", options->layout,
                     "parallel layout for the per-rank memory plan, as train's --layout (e.g. "
                     "ep64, dp4.ep2)");
    info->add_option("--ranks", options->ranks,
                     "ranks of the job (default: tp * cp * pp * dp of the layout; tp * cp * pp * "
                     "ep when dp is "
                     "left out)")
        ->check(whole_number(1, int64_t{1} << 20));
    info->add_option("--batch-size", options->batch_size, "sequences per micro-batch on one rank")
        ->capture_default_str()
        ->check(whole_number(1, int64_t{1} << 20));
    info->add_option("--domain-size", options->domain_size,
                     "ranks per scale-up domain (0: one domain), as train's")
        ->check(whole_number(0, int64_t{1} << 20));
    add_dispatch_option(*info, options->dispatch, "flat or two_tier, as train's");
    add_moe_overlap_option(*info, options->moe_overlap, Side::engine,
                           "off, shared or dual, as train's");
    add_precision_option(*info, options->precision, Side::engine,
                         "the recipe, as train's (its dispatch buffers hold the packed tokens)");
    add_dispatch_payload_option(
        *info, [options](parallel::DispatchPayload p) { options->dispatch_payload = p; },
        parallel::DispatchPayload::recipe, "recipe or activation, as train's");
    info->add_option("--moe-capacity-factor", options->moe_capacity_factor,
                     "expert-side buffers in units of the balanced load, as train's (0: the "
                     "worst case)")
        ->capture_default_str()
        ->check(finite_number(0, 1e6));
    info->add_option("--redundant-experts", options->redundant_experts,
                     "spare expert slots over the EP group, as train's")
        ->check(whole_number(0, int64_t{1} << 20));
    info->callback([options] { run_info(*options); });
}

}  // namespace moetron::cli
