// moetron plan: searches parallel layouts for a model, a cluster, a GPU count and a global
// batch; rejects those that do not fit in memory, ranks the rest by delivered TFLOPs/GPU and
// explains the top five. --scaling 256,512,1024 keeps the best layout, grows the global batch
// with the GPUs (weak scaling) and prints the per-GPU throughput kept.
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/cli/plan_progress.h"
#include "moetron/cli/sim_options.h"
#include "moetron/cli/vocabulary.h"
#include "moetron/core/error.h"
#include "moetron/core/precision.h"
#include "moetron/core/timer.h"
#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/model/moe.h"
#include "moetron/sim/expert_imbalance.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/planner.h"
#include "moetron/sim/report.h"
#include "moetron/sim/step.h"
#include "moetron/sim/svg.h"

namespace moetron::cli {

namespace {

struct PlanFlags {
    std::string model_path, cluster_path, precision = "bf16", svg_path, scaling;
    std::string dispatch = "two_tier", cuda_graphs = "none";
    int64_t gpus = 0, global_batch = 0, seq_len = 4096;
    int top = 5;
    bool count_mtp = true, overlap_tp = false;
    parallel::DispatchPayload dispatch_payload = parallel::DispatchPayload::activation;
    std::string moe_overlap = "off";
    sim::MemoryFlags memory;
    std::string pipeline_schedule = "1f1b";
    std::string expert_imbalance;  // zipf:S or a --log-jsonl file; empty: balanced
    int64_t redundant_experts = 0;
};

// The width of the terminal `stream` writes to; 0 when it is no terminal.
size_t terminal_columns(std::FILE* stream) {
    const int fd = fileno(stream);
    if (isatty(fd) != 1) return 0;
    winsize size{};
    constexpr size_t kUsualColumns = 80;  // a terminal that does not say
    return ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 ? size.ws_col : kUsualColumns;
}

std::vector<int64_t> parse_counts(const std::string& text) {
    std::vector<int64_t> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            const long long v = std::stoll(item, &used);
            MT_USER_CHECK(used == item.size() && v > 0, "bad");
            out.push_back(v);
        } catch (const std::exception&) {
            MT_USER_THROW("[plan] --scaling '{}': '{}' is not a positive GPU count", text, item);
        }
    }
    MT_USER_CHECK(!out.empty(), "[plan] --scaling needs GPU counts such as 256,512,1024");
    return out;
}

void run_plan(const PlanFlags& f) {
    const ModelConfig model = load_model_config(model_config_path(f.model_path));
    const sim::ClusterSpec cluster = sim::load_cluster_spec(cluster_config_path(f.cluster_path));
    sim::SimOptions base;
    base.precision = parse_precision(f.precision);
    (void)cluster.recipe_peak_flops(base.precision);  // a recipe this GPU lacks: say so now
    base.seq_len = f.seq_len;
    base.global_batch = f.global_batch;
    base.count_mtp = f.count_mtp;
    base.dispatcher =
        f.dispatch == "flat" ? parallel::DispatchKind::flat : parallel::DispatchKind::two_tier;
    base.dispatch_payload = f.dispatch_payload;
    base.cuda_graphs = sim::cuda_graphs_from_name(f.cuda_graphs);
    base.moe_overlap = parse_moe_overlap(f.moe_overlap);
    base.overlap_tp = f.overlap_tp;
    base.memory = sim::memory_options_from_flags(f.memory);
    base.pipeline_schedule = sim::pipeline_schedule_from_name(f.pipeline_schedule);
    if (!f.expert_imbalance.empty()) {
        base.expert_loads = sim::expert_loads_from_spec(f.expert_imbalance, model.n_routed_experts);
    }
    base.redundant_experts = f.redundant_experts;

    PlanProgressPrinter progress(stderr, terminal_columns(stderr));
    const Timer search;
    const sim::PlanResult plan = sim::plan_layouts(
        model, cluster, f.gpus, base, sim::PlanSpace{},
        [&](const sim::PlanProgress& p) { progress.update(p, search.elapsed_s()); });
    progress.finish(search.elapsed_s());
    std::printf("moetron plan: %s on %lld x %s, global batch %lld x %lld tokens, %s\n",
                model.name.c_str(), static_cast<long long>(f.gpus), cluster.name.c_str(),
                static_cast<long long>(f.global_batch), static_cast<long long>(f.seq_len),
                f.precision.c_str());
    std::printf("  %lld layouts divide the GPUs, model and batch; %lld do not fit in %.0f GB\n\n",
                static_cast<long long>(plan.considered),
                static_cast<long long>(plan.rejected_memory), cluster.gpu.hbm_bytes / 1e9);
    if (plan.considered == 0) {
        MT_USER_THROW(
            "[plan] no layout of {} on {} GPUs suits global batch {} with the {} schedule{} "
            "(zb-h1 and dualpipe run without vpp, zb-h1 without --moe-overlap dual; dualpipe "
            "needs an even pp and micro-batch count)",
            model.name, f.gpus, f.global_batch, f.pipeline_schedule,
            base.combined_1f1b() ? " and --moe-overlap dual" : "");
    }
    if (plan.ranked.empty()) {
        MT_USER_THROW("[plan] no layout of {} on {} x {} fits in memory with global batch {}",
                      model.name, f.gpus, cluster.name, f.global_batch);
    }
    if (!base.expert_loads.empty() || base.redundant_experts > 0) {
        std::printf(
            "  routing: %s expert loads, %lld redundant experts; the best layout's tokens "
            "per EP rank max/mean %.3f\n\n",
            base.expert_loads.empty() ? "balanced" : f.expert_imbalance.c_str(),
            static_cast<long long>(base.redundant_experts), plan.ranked[0].result.expert_imbalance);
    }
    for (int i = 0; i < f.top && i < static_cast<int>(plan.ranked.size()); ++i) {
        std::printf("%s", sim::explain_candidate(plan.ranked[i], plan.ranked[0], i + 1).c_str());
    }

    if (f.scaling.empty()) return;
    const std::vector<int64_t> counts = parse_counts(f.scaling);
    const sim::StepResult& best = plan.ranked[0].result;
    std::vector<sim::ScalingPoint> points;
    std::printf("\n  weak scaling with the best layout (global batch grows with the GPUs):\n");
    for (int64_t n : counts) {
        MT_USER_CHECK(
            n * f.global_batch % f.gpus == 0,
            "[plan] --scaling: {} GPUs do not scale the global batch {} of {} GPUs evenly", n,
            f.global_batch, f.gpus);
        parallel::Layout l = best.layout;
        MT_USER_CHECK(
            n % (l.tp * l.cp * l.pp) == 0,
            "[plan] --scaling: {} GPUs are not a multiple of tp*cp*pp = {} of the best layout", n,
            l.tp * l.cp * l.pp);
        l.dp = n / (l.tp * l.cp * l.pp);
        sim::SimOptions o = best.options;
        o.global_batch = f.global_batch * n / f.gpus;
        const sim::StepResult r = sim::simulate_step(model, cluster, l, o);
        sim::ScalingPoint p;
        p.gpus = n;
        p.tflops_per_gpu = r.tflops_per_gpu;
        p.efficiency = points.empty() ? 1.0 : r.tflops_per_gpu / points.front().tflops_per_gpu;
        points.push_back(p);
        std::printf("  %6lld GPUs  gbs %6lld  %s  %7.1f TFLOPs/GPU  %6.1f%%\n",
                    static_cast<long long>(n), static_cast<long long>(o.global_batch),
                    l.str().c_str(), p.tflops_per_gpu, 100 * p.efficiency);
    }
    if (!f.svg_path.empty()) {
        sim::write_text_file(f.svg_path,
                             sim::scaling_svg(points, model.name + " on " + cluster.name));
        std::printf("  chart written to %s\n", f.svg_path.c_str());
    }
}

}  // namespace

void register_plan(CLI::App& app) {
    auto f = std::make_shared<PlanFlags>();
    CLI::App* cmd = app.add_subcommand(
        "plan", "Search parallel layouts that fit a GPU cluster and rank them by TFLOPs/GPU");
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
    cmd->add_option("--gbs", f->global_batch, "global batch in sequences")
        ->required()
        ->check(whole_number(1, int64_t{1} << 40));
    cmd->add_option("--seq-len", f->seq_len, "tokens per sequence")
        ->capture_default_str()
        ->check(whole_number(1, int64_t{1} << 24));
    add_precision_option(*cmd, f->precision, Side::cluster_model, kSimPrecisionHelp);
    cmd->add_flag("--count-mtp,!--no-count-mtp", f->count_mtp,
                  "count the MTP FLOPs and simulate the MTP layer (default on)");
    add_dispatch_option(*cmd, f->dispatch, "MoE all-to-all: two_tier or flat");
    add_dispatch_payload_option(
        *cmd, [f](parallel::DispatchPayload p) { f->dispatch_payload = p; },
        parallel::DispatchPayload::activation, kSimDispatchPayloadHelp);
    cmd->add_option("--cuda-graphs", f->cuda_graphs, "none, partial or full")
        ->capture_default_str();
    add_moe_overlap_option(*cmd, f->moe_overlap, Side::cluster_model, kSimMoeOverlapHelp);
    cmd->add_flag("--overlap-tp", f->overlap_tp, "hide TP collectives behind adjacent GEMMs");
    add_pp_schedule_option(*cmd, f->pipeline_schedule, Side::cluster_model, kSimPpScheduleHelp);
    add_memory_options(*cmd, f->memory);
    add_expert_imbalance_options(*cmd, f->expert_imbalance, f->redundant_experts);
    cmd->add_option("--top", f->top, "how many layouts to explain")->capture_default_str();
    cmd->add_option("--scaling", f->scaling,
                    "GPU counts for weak scaling with the best layout, e.g. 256,512,1024");
    cmd->add_option("--svg", f->svg_path, "with --scaling: write the scaling chart as SVG");
    cmd->callback([f] { run_plan(*f); });
}

}  // namespace moetron::cli
