#include "moetron/sim/step.h"

// One training step on the cluster as a sequence of phases (step_phases.h): what each block and
// chunk costs, the pipeline schedule, each stage's data-parallel sync, optimizer and memory,
// and the delivered throughput.
#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/model/flops.h"
#include "moetron/model/layout_fit.h"
#include "moetron/sim/expert_imbalance.h"
#include "moetron/sim/fit.h"
#include "moetron/sim/step_phases.h"

namespace moetron::sim {

namespace {

void validate_inputs(const ModelConfig& m, const ClusterSpec& c, const parallel::Layout& l,
                     const SimOptions& o) {
    // A layout built by the planner or a test has not been through the parser: check it the same.
    (void)parallel::resolve_layout(l, l.world_size());
    validate_layout_for_model(l, m);
    (void)c.recipe_peak_flops(o.precision);  // throws for a recipe the GPU lacks
    check_moe_overlap_modelled(o.moe_overlap);
    MT_CHECK(l.tp <= c.scale_up.domain_gpus,
             "[sim] tp {} spans more than one scale-up domain of {} GPUs on {}", l.tp,
             c.scale_up.domain_gpus, c.name);
    MT_CHECK(o.seq_len >= 1 && o.seq_len % (2 * l.cp) == 0,
             "[sim] sequence length {} must be a multiple of 2*cp = {} (causal load balance)",
             o.seq_len, 2 * l.cp);
    MT_CHECK(o.seq_len % (l.tp * l.cp) == 0,
             "[sim] sequence length {} must be a multiple of tp*cp = {} (sequence parallel)",
             o.seq_len, l.tp * l.cp);
    if (o.pipeline_schedule == PipelineSchedule::zero_bubble_h1 &&
        (l.vpp > 1 || o.combined_1f1b())) {
        MT_USER_THROW(
            "the zb-h1 pipeline schedule runs without interleaving and without --moe-overlap dual "
            "(got vpp {}{})",
            l.vpp, o.combined_1f1b() ? " and --moe-overlap dual" : "");
    }
    // Megatron-LM's combined 1F1B (EP all-to-all overlap) needs interleaving once there is a
    // pipeline (TransformerConfig: "virtual_pipeline_model_parallel_size must be specified when
    // pipeline_model_parallel_size > 1"); DualPipe brings its own overlap.
    if (o.combined_1f1b() && l.pp > 1 && l.vpp == 1 &&
        o.pipeline_schedule != PipelineSchedule::dualpipe) {
        MT_USER_THROW(
            "--moe-overlap dual with pp {} needs interleaving (vpp > 1), as Megatron-LM's "
            "combined 1F1B does, or the dualpipe schedule",
            l.pp);
    }
    if (o.pipeline_schedule == PipelineSchedule::dualpipe) {
        const int64_t m = o.global_batch / std::max<int64_t>(1, l.dp * o.micro_batch);
        if (l.vpp > 1 || l.pp < 2 || l.pp % 2 != 0 || m < l.pp || m % 2 != 0) {
            MT_USER_THROW(
                "the dualpipe schedule needs an even pp >= 2 without vpp and an even number of "
                "micro-batches, at least pp (got pp {}, vpp {}, {} micro-batches)",
                l.pp, l.vpp, m);
        }
    }
    MT_CHECK(o.micro_batch >= 1, "[sim] micro-batch size must be >= 1, got {}", o.micro_batch);
    MT_CHECK(o.global_batch >= 1 && o.global_batch % (l.dp * o.micro_batch) == 0,
             "[sim] global batch {} is not a multiple of dp {} x micro-batch {} = {}",
             o.global_batch, l.dp, o.micro_batch, l.dp * o.micro_batch);
}

// Tokens per EP rank, max / mean, that the expert loads give on this layout: the contiguous
// split without redundant experts, training's placement of the R spare slots with them.
double expert_imbalance_of(const ModelConfig& m, const LayoutPlacement& placement,
                           const SimOptions& o) {
    if (o.redundant_experts != 0) {
        MT_USER_CHECK(o.redundant_experts > 0, "--redundant-experts must be >= 0, got {}",
                      o.redundant_experts);
        MT_USER_CHECK(m.n_routed_experts > 0, "--redundant-experts {}: {} has no routed experts",
                      o.redundant_experts, m.name);
        MT_USER_CHECK(placement.ep.size > 1,
                      "--redundant-experts {} spreads spare expert slots over an expert-parallel "
                      "group: it needs ep > 1",
                      o.redundant_experts);
    }
    if (o.expert_loads.empty() && o.redundant_experts == 0) return 1;
    parallel::PlacementShape shape;
    shape.num_experts = m.n_routed_experts;
    shape.num_slots = m.n_routed_experts + o.redundant_experts;
    shape.ep_size = placement.ep.size;
    shape.num_domains = placement.ep.domains;
    shape.num_groups = std::max<int64_t>(1, m.n_group);
    parallel::check_placement_shape(shape);
    if (o.expert_loads.empty()) return 1;  // balanced loads stay balanced on any placement
    MT_USER_CHECK(static_cast<int64_t>(o.expert_loads.size()) == m.n_routed_experts,
                  "the expert load histogram has {} experts but {} has {} routed experts",
                  o.expert_loads.size(), m.name, m.n_routed_experts);
    const ExpertImbalance imbalance = expert_rank_imbalance(o.expert_loads, shape);
    return o.redundant_experts > 0 ? imbalance.redundant : imbalance.contiguous;
}

}  // namespace

void check_moe_overlap_modelled(MoeOverlap overlap) {
    MT_USER_CHECK(overlap != MoeOverlap::shared,
                  "simulate and plan do not model --moe-overlap shared (the shared experts "
                  "computing while the dispatch flies) yet; use off, or dual (priced as "
                  "Megatron-LM's combined 1F1B)");
}

namespace step_phases {
namespace {

// The step's identity: what runs where, and how many micro-batches each pipeline runs.
StepResult step_header(const ModelConfig& model, const ClusterSpec& cluster,
                       const parallel::Layout& layout, const SimOptions& o) {
    StepResult r;
    r.model_name = model.name;
    r.cluster_name = cluster.name;
    r.layout = layout;
    r.options = o;
    r.gpus = layout.world_size();
    r.micro_batches = o.global_batch / (layout.dp * o.micro_batch);
    return r;
}

// What the ops of a block depend on: the model on the cluster's domains, the micro-batch, the
// formats, and the routing imbalance the expert loads give on this layout.
OpContext op_context(const ModelConfig& model, const ClusterSpec& cluster,
                     const parallel::Layout& layout, const SimOptions& o) {
    OpContext ctx;
    ctx.model = &model;
    ctx.cluster = &cluster;
    ctx.layout = layout;
    ctx.placement = place_layout(layout, cluster.scale_up.domain_gpus);
    ctx.seq_len = o.seq_len;
    ctx.micro_batch = o.micro_batch;
    ctx.settings.precision = o.precision;
    ctx.settings.dispatcher = o.dispatcher;
    ctx.settings.dispatch_in_recipe = o.dispatch_payload == parallel::DispatchPayload::recipe;
    ctx.settings.low_precision_swiglu_input = o.memory.low_precision_swiglu_input;
    ctx.settings.cuda_graph_moe_sync_free = o.cuda_graphs == CudaGraphs::full;
    ctx.settings.expert_load_imbalance = expert_imbalance_of(model, ctx.placement, o);
    ctx.settings.redundant_experts = o.redundant_experts;
    return ctx;
}

// Per global chunk: its main-model layers, and its blocks' forward and backward times.
void add_chunk_contents(StepResult& r, const ChunkGroups& groups, const BlockCosts& blocks) {
    r.stage_layers.resize(groups.size());
    r.chunk_block_times.resize(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
        for (const ChunkBlock& it : groups[g]) {
            const Walks& w = blocks.walks.at(it.kind);
            if (it.layer >= 0) r.stage_layers[g].push_back(it.layer);
            r.chunk_block_times[g].push_back({w.fwd.time_s, w.bwd.time_s});
        }
    }
}

// The stage the pipeline runs at the pace of: the busiest.
int64_t busiest_stage(const ScheduleResult& schedule) {
    return std::max_element(schedule.busy_s.begin(), schedule.busy_s.end()) -
           schedule.busy_s.begin();
}

const MemoryBreakdown& fullest(const std::vector<MemoryBreakdown>& stages) {
    return *std::max_element(stages.begin(), stages.end(),
                             [](const MemoryBreakdown& a, const MemoryBreakdown& b) {
                                 return a.total_bytes() < b.total_bytes();
                             });
}

// Throughput in the Megatron-LM FLOP convention.
void add_throughput(StepResult& r, const ModelConfig& model, const ClusterSpec& cluster,
                    const SimOptions& o, bool with_mtp) {
    r.model_flops_per_token = flops_per_token(model, o.seq_len, with_mtp).total;
    const double tokens_per_step = static_cast<double>(o.global_batch * o.seq_len);
    r.tokens_per_s_per_gpu = tokens_per_step / r.step_time_s / static_cast<double>(r.gpus);
    r.tflops_per_gpu = r.tokens_per_s_per_gpu * r.model_flops_per_token / 1e12;
    r.mfu = r.tflops_per_gpu * 1e12 / cluster.recipe_peak_flops(o.precision);
}

// One MoE (or dense) layer's forward and backward timeline, for the SVG.
void add_layer_timeline(StepResult& r, const ModelConfig& model, const ClusterSpec& cluster,
                        const SimOptions& o, const BlockCosts& blocks) {
    const BlockKind shown =
        model.n_routed_experts > 0 ? BlockKind::moe_layer : BlockKind::dense_layer;
    const WalkOptions wo{o.cuda_graphs, o.overlap_tp};
    OpList f, b;
    f.append(blocks.ops.at(shown).forward);
    b.append(blocks.recomputed.at(shown).backward);
    r.moe_layer_forward = walk_ops(cluster, f, wo, false, true).events;
    r.moe_layer_backward = walk_ops(cluster, b, wo, false, true).events;
}

}  // namespace
}  // namespace step_phases

StepResult simulate_step(const ModelConfig& model, const ClusterSpec& cluster,
                         const parallel::Layout& layout, const SimOptions& options) {
    StepResult r = simulate_step_unchecked(model, cluster, layout, options);
    if (r.memory.total_bytes() > r.memory.capacity_bytes) {
        check_fits(
            r.memory,
            fmt::format("{} on {} x {} with {}", model.name, r.gpus, cluster.name, layout.str()),
            describe_fit(find_cheapest_fit(model, cluster, layout, options)));
    }
    return r;
}

StepResult simulate_step_unchecked(const ModelConfig& model, const ClusterSpec& cluster,
                                   const parallel::Layout& layout, const SimOptions& o) {
    using namespace step_phases;
    validate_inputs(model, cluster, layout, o);
    StepResult r = step_header(model, cluster, layout, o);
    const OpContext ctx = op_context(model, cluster, layout, o);
    r.placement = ctx.placement;
    r.expert_imbalance = ctx.settings.expert_load_imbalance;

    // What each block costs, which blocks each pipeline chunk holds, what each chunk costs.
    const bool with_mtp = o.count_mtp && model.num_nextn_predict_layers > 0;
    const BlockCosts blocks = block_costs(ctx, o, with_mtp);
    const PipelineShape shape = pipeline_shape(ctx, o, r.micro_batches);
    const ChunkGroups groups = chunk_layout(model, o, with_mtp, blocks, shape);
    const ChunkCosts chunks = chunk_costs(ctx, o, blocks, groups);
    add_chunk_contents(r, groups, blocks);

    // The pipeline schedule, what each stage adds around it, and the step's time at the pace of
    // the slowest stage and GPU; the breakdown describes the busiest stage.
    r.schedule = pipeline_schedule(chunks.walks, shape);
    const std::vector<StageSync> stages =
        data_parallel_sync(ctx, o, shape, r.schedule, chunks, groups);
    const StepTime time = step_time(cluster, layout, stages);
    r.step_time_s = time.step_s();
    r.dp_end_s = time.compute_end_s;
    r.optimizer_end_s = time.compute_end_s + time.optimizer_s;
    r.critical_stage = busiest_stage(r.schedule);
    r.breakdown = critical_stage_breakdown(r, shape, chunks, stages[r.critical_stage], time);

    r.memory_per_stage = stage_memory(model, cluster, layout, o, shape, r.schedule, chunks, groups);
    r.memory = fullest(r.memory_per_stage);
    add_throughput(r, model, cluster, o, with_mtp);
    add_layer_timeline(r, model, cluster, o, blocks);
    return r;
}

}  // namespace moetron::sim
