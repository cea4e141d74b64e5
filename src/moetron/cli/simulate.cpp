// moetron simulate: predicts one training step of a model on a cluster with a parallel layout:
// step time, tokens/s/GPU, delivered TFLOPs/GPU (Megatron-LM convention), MFU, memory per GPU
// and where the time goes. The cluster model lives in sim/ (docs/cluster-model.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/cli/sim_options.h"
#include "moetron/cli/vocabulary.h"
#include "moetron/core/error.h"
#include "moetron/core/precision.h"
#include "moetron/model/config.h"
#include "moetron/model/moe.h"
#include "moetron/parallel/layout.h"
#include "moetron/sim/expert_imbalance.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/report.h"
#include "moetron/sim/step.h"
#include "moetron/sim/svg.h"

namespace moetron::cli {

namespace {

struct SimulateFlags {
    std::string model_path, cluster_path, layout, precision = "bf16", svg_path;
    std::string recompute = "none", dispatch = "two_tier", cuda_graphs = "none";
    std::string pipeline_layout;
    int64_t gpus = 0, global_batch = 0, micro_batch = 1, seq_len = 4096;
    bool count_mtp = true, json = false;
    parallel::DispatchPayload dispatch_payload = parallel::DispatchPayload::activation;
    std::string moe_overlap = "off";
    bool overlap_tp = false, no_overlap_dp_grad = false;
    bool no_overlap_dp_param = false;
    bool layer_ops = false;
    sim::MemoryFlags memory;
    std::string pipeline_schedule = "1f1b";
    std::string expert_imbalance;  // zipf:S or a --log-jsonl file; empty: balanced
    int64_t redundant_experts = 0;
};

sim::SimOptions to_options(const SimulateFlags& f, const ModelConfig& model) {
    sim::SimOptions o;
    o.precision = parse_precision(f.precision);
    o.seq_len = f.seq_len;
    o.global_batch = f.global_batch;
    o.micro_batch = f.micro_batch;
    o.count_mtp = f.count_mtp;
    o.recompute = sim::parse_recompute(f.recompute);
    o.dispatcher =
        f.dispatch == "flat" ? parallel::DispatchKind::flat : parallel::DispatchKind::two_tier;
    o.dispatch_payload = f.dispatch_payload;
    o.cuda_graphs = sim::cuda_graphs_from_name(f.cuda_graphs);
    o.moe_overlap = parse_moe_overlap(f.moe_overlap);
    o.overlap_tp = f.overlap_tp;
    o.overlap_dp_grad = !f.no_overlap_dp_grad;
    o.overlap_dp_param = !f.no_overlap_dp_param;
    o.pipeline_layout = f.pipeline_layout;
    o.memory = sim::memory_options_from_flags(f.memory);
    o.pipeline_schedule = sim::pipeline_schedule_from_name(f.pipeline_schedule);
    if (!f.expert_imbalance.empty()) {
        o.expert_loads = sim::expert_loads_from_spec(f.expert_imbalance, model.n_routed_experts);
    }
    o.redundant_experts = f.redundant_experts;
    return o;
}

void run_simulate(const SimulateFlags& f) {
    const ModelConfig model = load_model_config(model_config_path(f.model_path));
    const sim::ClusterSpec cluster = sim::load_cluster_spec(cluster_config_path(f.cluster_path));
    const parallel::Layout layout = parallel::parse_layout(f.layout, f.gpus);
    const sim::SimOptions options = to_options(f, model);
    const sim::StepResult r = sim::simulate_step(model, cluster, layout, options);
    // With redundant experts, the same step without them beside it (what the spare slots buy).
    std::optional<sim::StepResult> without_redundant;
    if (options.redundant_experts > 0) {
        sim::SimOptions o = options;
        o.redundant_experts = 0;
        without_redundant = sim::simulate_step_unchecked(model, cluster, layout, o);
    }
    if (f.json) {
        nlohmann::json report = sim::step_report_json(r);
        if (without_redundant) {
            report["without_redundant_experts"] = {
                {"step_time_s", without_redundant->step_time_s},
                {"tflops_per_gpu", without_redundant->tflops_per_gpu},
                {"expert_imbalance", without_redundant->expert_imbalance}};
        }
        std::printf("%s\n", report.dump(2).c_str());
    } else {
        std::printf("%s", sim::format_step_report(r).c_str());
        if (without_redundant) {
            std::printf("%s", sim::format_redundant_comparison(r, *without_redundant).c_str());
        }
        if (f.layer_ops) std::printf("\n%s", sim::format_layer_ops(r).c_str());
    }
    if (!f.svg_path.empty()) {
        sim::write_text_file(f.svg_path, sim::step_timeline_svg(r));
        if (!f.json) std::printf("\n  timeline written to %s\n", f.svg_path.c_str());
    }
}

}  // namespace

void register_simulate(CLI::App& app) {
    auto f = std::make_shared<SimulateFlags>();
    CLI::App* cmd = app.add_subcommand(
        "simulate", "Predict step time, TFLOPs/GPU and memory of a layout on a GPU cluster");
    cmd->add_option("--config", f->model_path,
                    "model: a preset name (tiny, small, dsv3-671b), a TOML file or a HF "
                    "config.json")
        ->required();
    cmd->add_option("--cluster", f->cluster_path,
                    "cluster: a preset name (h100-hgx, gb300-nvl72, ...) or a TOML file")
        ->required();
    cmd->add_option("--gpus", f->gpus, "number of GPUs")
        ->required()
        ->check(whole_number(1, int64_t{1} << 24));
    cmd->add_option("--layout", f->layout, "parallel layout, e.g. tp1.pp2.vpp4.ep32")->required();
    cmd->add_option("--gbs", f->global_batch, "global batch in sequences")
        ->required()
        ->check(whole_number(1, int64_t{1} << 40));
    cmd->add_option("--mbs", f->micro_batch, "micro-batch in sequences")
        ->capture_default_str()
        ->check(whole_number(1, int64_t{1} << 40));
    cmd->add_option("--seq-len", f->seq_len, "tokens per sequence")
        ->capture_default_str()
        ->check(whole_number(1, int64_t{1} << 24));
    add_precision_option(*cmd, f->precision, Side::cluster_model, kSimPrecisionHelp);
    cmd->add_flag("--count-mtp,!--no-count-mtp", f->count_mtp,
                  "count the MTP FLOPs and simulate the MTP layer (default on)");
    cmd->add_option("--recompute", f->recompute,
                    "none, full, or modules: layernorm,mla_up_proj,core_attn,mlp,moe_act,"
                    "shared_expert,moe")
        ->capture_default_str();
    add_dispatch_option(*cmd, f->dispatch,
                        "MoE all-to-all: two_tier (dedup per rank and domain) or flat");
    add_dispatch_payload_option(
        *cmd, [f](parallel::DispatchPayload p) { f->dispatch_payload = p; },
        parallel::DispatchPayload::activation, kSimDispatchPayloadHelp);
    cmd->add_option("--cuda-graphs", f->cuda_graphs, "none, partial or full")
        ->capture_default_str();
    add_moe_overlap_option(*cmd, f->moe_overlap, Side::cluster_model, kSimMoeOverlapHelp);
    cmd->add_flag("--overlap-tp", f->overlap_tp, "hide TP collectives behind adjacent GEMMs");
    cmd->add_flag("--no-overlap-dp-grad", f->no_overlap_dp_grad,
                  "run the gradient reduce-scatter after the backward pass");
    cmd->add_flag("--no-overlap-dp-param", f->no_overlap_dp_param,
                  "run the parameter all-gather before the next forward pass");
    cmd->add_option("--pp-layout", f->pipeline_layout,
                    "Megatron-LM pipeline layout such as 'Et|(tt|)*30mL' (default: balanced)");
    add_pp_schedule_option(*cmd, f->pipeline_schedule, Side::cluster_model, kSimPpScheduleHelp);
    add_memory_options(*cmd, f->memory);
    add_expert_imbalance_options(*cmd, f->expert_imbalance, f->redundant_experts);
    cmd->add_flag("--json", f->json, "print JSON instead of the table");
    cmd->add_flag("--layer-ops", f->layer_ops, "also print one layer's op timeline");
    cmd->add_option("--svg", f->svg_path, "write the step timeline as SVG to this path");
    cmd->callback([f] { run_simulate(*f); });
}

}  // namespace moetron::cli
