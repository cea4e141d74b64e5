#include "moetron/sim/step.h"

#include <algorithm>
#include <initializer_list>
#include <map>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/model/flops.h"
#include "moetron/model/layout_fit.h"
#include "moetron/sim/chunks.h"
#include "moetron/sim/collectives.h"
#include "moetron/sim/costs.h"
#include "moetron/sim/expert_imbalance.h"
#include "moetron/sim/fit.h"

namespace moetron::sim {

namespace {

constexpr int kOptimizerKernels = 100;  // multi-tensor Adam, grad norm and clipping launches

// Optimizer HBM traffic per sharded parameter: the main gradient read twice (gradient norm,
// then the update), the main parameter and both moments read and written (24 bytes with fp32
// gradients and parameters and bf16 moments).
double optimizer_bytes_per_param(const OptimizerPrecision& p) {
    return 2 * p.main_grad_bytes + 2 * p.state_bytes();
}

// Activation offloading copies a chunk's offloaded activations to host memory on a copy engine
// while its forward computes, and back while its backward computes (Megatron-LM's fine-grained
// offloading prefetches each layer's during the layer after it). The copy hides behind the
// compute unless it takes longer; then the task waits for it.
void add_offload_copies(const ClusterSpec& c, double offloaded_bytes,
                        std::initializer_list<WalkResult*> tasks) {
    if (offloaded_bytes <= 0) return;
    if (c.gpu.host_link_bytes_per_s <= 0) {
        MT_USER_THROW(
            "--offload-activations needs the GPU's host link bandwidth: {} has no "
            "host_link_gbytes_per_s under [gpu]",
            c.name);
    }
    const double copy_s = offloaded_bytes / c.gpu.host_link_bytes_per_s;
    for (WalkResult* t : tasks) {
        const double exposed = std::max(0.0, copy_s - t->time_s);
        t->time_s += exposed;
        t->parts.offload_exposed_s += exposed;
    }
}

void validate_inputs(const ModelConfig& m, const ClusterSpec& c, const parallel::Layout& l,
                     const SimOptions& o) {
    // A layout built by the planner or a test has not been through the parser: check it the same.
    (void)parallel::resolve_layout(l, l.world_size());
    validate_layout_for_model(l, m);
    MT_CHECK(o.precision != Precision::tf32,
             "[sim] training precision must be fp32 (a calibrated CPU), bf16, fp8, mxfp8 or fp4 "
             "(tf32 is the router's)");
    (void)c.peak_flops(o.precision);  // throws for a precision the GPU lacks
    MT_CHECK(l.tp <= c.scale_up.domain_gpus,
             "[sim] tp {} spans more than one scale-up domain of {} GPUs on {}", l.tp,
             c.scale_up.domain_gpus, c.name);
    MT_CHECK(o.seq_len >= 1 && o.seq_len % (2 * l.cp) == 0,
             "[sim] sequence length {} must be a multiple of 2*cp = {} (causal load balance)",
             o.seq_len, 2 * l.cp);
    MT_CHECK(o.seq_len % (l.tp * l.cp) == 0,
             "[sim] sequence length {} must be a multiple of tp*cp = {} (sequence parallel)",
             o.seq_len, l.tp * l.cp);
    if (o.pipeline_schedule == PipelineSchedule::zero_bubble_h1 && (l.vpp > 1 || o.overlap_ep)) {
        MT_USER_THROW(
            "the zb-h1 pipeline schedule runs without interleaving and without --overlap-ep "
            "(got vpp {}{})",
            l.vpp, o.overlap_ep ? " and --overlap-ep" : "");
    }
    // Megatron-LM's combined 1F1B (EP all-to-all overlap) needs interleaving once there is a
    // pipeline (TransformerConfig: "virtual_pipeline_model_parallel_size must be specified when
    // pipeline_model_parallel_size > 1"); DualPipe brings its own overlap.
    if (o.overlap_ep && l.pp > 1 && l.vpp == 1 &&
        o.pipeline_schedule != PipelineSchedule::dualpipe) {
        MT_USER_THROW(
            "--overlap-ep with pp {} needs interleaving (vpp > 1), as in Megatron-LM, or the "
            "dualpipe schedule",
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
    validate_inputs(model, cluster, layout, o);
    const WalkOptions wo{o.cuda_graphs, o.overlap_tp};
    StepResult r;
    r.model_name = model.name;
    r.cluster_name = cluster.name;
    r.layout = layout;
    r.options = o;
    r.gpus = layout.world_size();
    const int64_t pp = layout.pp, vpp = layout.vpp, chunks = pp * vpp;
    r.micro_batches = o.global_batch / (layout.dp * o.micro_batch);

    OpContext ctx;
    ctx.model = &model;
    ctx.cluster = &cluster;
    ctx.layout = layout;
    ctx.placement = place_layout(layout, cluster.scale_up.domain_gpus);
    r.placement = ctx.placement;
    ctx.seq_len = o.seq_len;
    ctx.micro_batch = o.micro_batch;
    ctx.settings.precision = o.precision;
    ctx.settings.dispatcher = o.dispatcher;
    ctx.settings.low_precision_dispatch = o.low_precision_dispatch;
    ctx.settings.low_precision_swiglu_input = o.memory.low_precision_swiglu_input;
    ctx.settings.cuda_graph_moe_sync_free = o.cuda_graphs == CudaGraphs::full;
    r.expert_imbalance = expert_imbalance_of(model, ctx.placement, o);
    ctx.settings.expert_load_imbalance = r.expert_imbalance;
    ctx.settings.redundant_experts = o.redundant_experts;

    // Blocks, their recomputed backward and their stand-alone cost (for the layout).
    const bool with_mtp = o.count_mtp && model.num_nextn_predict_layers > 0;
    std::map<BlockKind, BlockOps> blocks;
    std::map<BlockKind, RecomputedBlock> recomputed;
    std::vector<BlockKind> kinds = {BlockKind::dense_layer, BlockKind::embedding,
                                    BlockKind::output_head};
    if (model.n_routed_experts > 0) kinds.push_back(BlockKind::moe_layer);
    if (with_mtp) kinds.push_back(BlockKind::mtp_extra);
    struct BlockWalks {
        WalkResult fwd, bwd, fwd_deferred, bwd_deferred;
        WalkResult bwd_input, bwd_weight;  // the backward split into B and W (zero bubble)
    };
    std::map<BlockKind, BlockWalks> bw;
    std::map<BlockKind, double> block_cost;
    const double f_sm = cluster.efficiency.comm_sm_fraction;
    for (BlockKind k : kinds) {
        blocks[k] = build_block_ops(ctx, k);
        recomputed[k] = apply_recompute(blocks[k], o.recompute, o.memory.offload);
        OpList f, b;
        f.append(blocks[k].forward);
        b.append(recomputed[k].backward);
        BlockWalks& w = bw[k];
        w.fwd = walk_ops(cluster, f, wo, false, false);
        w.bwd = walk_ops(cluster, b, wo, false, false);
        w.fwd_deferred = walk_ops(cluster, f, wo, true, false);
        w.bwd_deferred = walk_ops(cluster, b, wo, true, false);
        OpList bi, bwt;
        bi.append_part(recomputed[k].backward, false);
        bwt.append_part(recomputed[k].backward, true);
        w.bwd_input = walk_ops(cluster, bi, wo, false, false);
        w.bwd_weight = walk_ops(cluster, bwt, wo, false, false);
        const double comm = w.fwd_deferred.ep_comm_s + w.bwd_deferred.ep_comm_s;
        // With EP overlap a block mostly runs inside combined forward-backward tasks.
        block_cost[k] =
            o.overlap_ep
                ? std::max(w.fwd_deferred.time_s + w.bwd_deferred.time_s + f_sm * comm, comm)
                : w.fwd.time_s + w.bwd.time_s;
    }

    std::vector<ChunkBlock> items;
    items.push_back({BlockKind::embedding, -1, block_cost[BlockKind::embedding]});
    for (int64_t i = 0; i < model.num_hidden_layers; ++i) {
        const BlockKind k = model.is_moe_layer(i) ? BlockKind::moe_layer : BlockKind::dense_layer;
        items.push_back({k, static_cast<int>(i), block_cost[k]});
    }
    items.push_back({BlockKind::output_head, -1, block_cost[BlockKind::output_head]});
    for (int64_t d = 0; with_mtp && d < model.num_nextn_predict_layers; ++d) {
        items.push_back({BlockKind::mtp_extra, -1, block_cost[BlockKind::mtp_extra]});
        const BlockKind k = model.mtp_layer_is_moe(d) && model.n_routed_experts > 0
                                ? BlockKind::moe_layer
                                : BlockKind::dense_layer;
        items.push_back({k, -1, block_cost[k]});
    }
    // Two layouts: chunks of equal cost, and chunks shifted so that stages have equal cost.
    // Keep the one whose schedule (on summed block times) ends first.
    const double act_bytes = static_cast<double>(o.micro_batch * o.seq_len) /
                             static_cast<double>(layout.tp * layout.cp) *
                             static_cast<double>(model.hidden_size) *
                             high_precision_bytes(o.precision);
    const double p2p_s = send_recv_cost(cluster, ctx.placement.pp.domains > 1, act_bytes).time_s;
    const bool merge = o.overlap_ep && model.n_routed_experts > 0 && layout.ep > 1;
    const bool zero_bubble = o.pipeline_schedule == PipelineSchedule::zero_bubble_h1;
    const bool dualpipe = o.pipeline_schedule == PipelineSchedule::dualpipe;
    // DualPipe's order is stood in for by the combined 1F1B (F&B pairs) for the event
    // simulation; its makespan comes from dualpipe_makespan_s below.
    const PipelineSchedule simulated_schedule =
        dualpipe ? PipelineSchedule::one_f_one_b : o.pipeline_schedule;
    auto approx_makespan = [&](const std::vector<std::vector<ChunkBlock>>& groups) {
        std::vector<double> f(chunks, 0), b(chunks, 0), fd(chunks, 0), bd(chunks, 0), af(chunks, 0),
            ab(chunks, 0), b_input(chunks, 0), w_grad(chunks, 0);
        for (int64_t g = 0; g < chunks; ++g) {
            for (const ChunkBlock& it : groups[g]) {
                const BlockWalks& w = bw[it.kind];
                f[g] += w.fwd.time_s;
                b[g] += w.bwd.time_s;
                fd[g] += w.fwd_deferred.time_s;
                bd[g] += w.bwd_deferred.time_s;
                af[g] += w.fwd_deferred.ep_comm_s;
                ab[g] += w.bwd_deferred.ep_comm_s;
                b_input[g] += w.bwd_input.time_s;
                w_grad[g] += w.bwd_weight.time_s;
            }
        }
        ScheduleInput in;
        in.pp = pp;
        in.vpp = vpp;
        in.micro_batches = r.micro_batches;
        in.merge_steady_state = merge || dualpipe;
        in.schedule = simulated_schedule;
        in.forward_s = [&](int64_t g) { return f[g]; };
        in.backward_s = [&](int64_t g) { return zero_bubble ? b_input[g] : b[g]; };
        in.weight_gradient_s = [&](int64_t g) { return w_grad[g]; };
        in.forward_backward_s = [&](int64_t gf, int64_t gb) {
            return std::max(fd[gf] + bd[gb] + f_sm * (af[gf] + ab[gb]), af[gf] + ab[gb]);
        };
        in.p2p_s = p2p_s;
        return run_schedule(in).makespan_s;
    };
    std::vector<std::vector<ChunkBlock>> groups;
    if (!o.pipeline_layout.empty()) {
        groups = layout_items(model, o.pipeline_layout, chunks, with_mtp, block_cost);
    } else {
        groups = partition_items(items, chunks);
        auto balanced = groups;
        balance_stages(balanced, pp);
        if (approx_makespan(balanced) < approx_makespan(groups)) groups = std::move(balanced);
    }

    // Per chunk: op lists, walks (inline EP and deferred EP), activations, parameters.
    struct ChunkCost {
        WalkResult fwd, bwd, fwd_deferred, bwd_deferred, bwd_input, bwd_weight;
        double saved_bytes = 0;
        double offloaded_bytes = 0;
        double largest_offloaded_block_bytes = 0;
        double weight_gradient_input_bytes = 0;  // held by a deferred W pass
        BlockParams params;
    };
    std::vector<ChunkCost> cc(chunks);
    r.stage_layers.resize(chunks);
    r.chunk_block_times.resize(chunks);
    for (int64_t g = 0; g < chunks; ++g) {
        OpList f, b;
        for (const ChunkBlock& it : groups[g]) {
            f.append(blocks[it.kind].forward);
            cc[g].saved_bytes += recomputed[it.kind].saved_bytes;
            cc[g].offloaded_bytes += recomputed[it.kind].offloaded_bytes;
            cc[g].weight_gradient_input_bytes += recomputed[it.kind].weight_gradient_input_bytes;
            cc[g].largest_offloaded_block_bytes =
                std::max(cc[g].largest_offloaded_block_bytes, recomputed[it.kind].offloaded_bytes);
            const BlockParams bp =
                block_params_per_gpu(model, it.kind, layout, o.redundant_experts);
            cc[g].params.dense += bp.dense;
            cc[g].params.expert += bp.expert;
            if (it.layer >= 0) r.stage_layers[g].push_back(it.layer);
            r.chunk_block_times[g].push_back({bw[it.kind].fwd.time_s, bw[it.kind].bwd.time_s});
        }
        OpList bi, bwt;
        for (auto it = groups[g].rbegin(); it != groups[g].rend(); ++it) {
            b.append(recomputed[it->kind].backward);
            bi.append_part(recomputed[it->kind].backward, false);
            bwt.append_part(recomputed[it->kind].backward, true);
        }
        cc[g].bwd_input = walk_ops(cluster, bi, wo, false, false);
        cc[g].bwd_weight = walk_ops(cluster, bwt, wo, false, false);
        cc[g].fwd = walk_ops(cluster, f, wo, false, false);
        cc[g].bwd = walk_ops(cluster, b, wo, false, false);
        cc[g].fwd_deferred = walk_ops(cluster, f, wo, true, false);
        cc[g].bwd_deferred = walk_ops(cluster, b, wo, true, false);
        add_offload_copies(
            cluster, cc[g].offloaded_bytes,
            {&cc[g].fwd, &cc[g].fwd_deferred, &cc[g].bwd, &cc[g].bwd_deferred, &cc[g].bwd_input});
    }
    auto merged = [&](int64_t gf, int64_t gb) {
        const double compute = cc[gf].fwd_deferred.time_s + cc[gb].bwd_deferred.time_s;
        const double comm = cc[gf].fwd_deferred.ep_comm_s + cc[gb].bwd_deferred.ep_comm_s;
        return std::max(compute + f_sm * comm, comm);
    };

    // Pipeline schedule.
    ScheduleInput si;
    si.pp = pp;
    si.vpp = vpp;
    si.micro_batches = r.micro_batches;
    si.merge_steady_state = merge || dualpipe;
    si.schedule = simulated_schedule;
    si.forward_s = [&](int64_t g) { return cc[g].fwd.time_s; };
    si.backward_s = [&](int64_t g) {
        return zero_bubble ? cc[g].bwd_input.time_s : cc[g].bwd.time_s;
    };
    si.weight_gradient_s = [&](int64_t g) { return cc[g].bwd_weight.time_s; };
    si.forward_backward_s = merged;
    si.p2p_s = p2p_s;
    r.schedule = run_schedule(si);
    // The chunks a stage holds: its vpp chunks, and with DualPipe the mirrored stage too.
    auto chunks_of_stage = [&](int64_t s) {
        std::vector<int64_t> out;
        for (int64_t c = 0; c < vpp; ++c) out.push_back(c * pp + s);
        if (dualpipe) out.push_back(pp - 1 - s);
        return out;
    };
    if (dualpipe) {
        // Rank s pairs forwards of one direction with backwards of the other: F&B is the mean
        // of its two chunks' pairings; B and W the means of their parts.
        double makespan = 0;
        for (int64_t s = 0; s < pp; ++s) {
            const int64_t a = s, b = pp - 1 - s;
            const double fb = (merged(a, b) + merged(b, a)) / 2;
            const double bi = (cc[a].bwd_input.time_s + cc[b].bwd_input.time_s) / 2;
            const double w = (cc[a].bwd_weight.time_s + cc[b].bwd_weight.time_s) / 2;
            makespan = std::max(makespan, dualpipe_makespan_s(pp, r.micro_batches, fb, bi, w));
        }
        // Stretch the stand-in's timeline to DualPipe's makespan (DP overlap and the SVG read
        // task times).
        const double k = makespan / r.schedule.makespan_s;
        for (auto& stage : r.schedule.stages) {
            for (ScheduledTask& t : stage) {
                t.start_s *= k;
                t.end_s *= k;
            }
        }
        for (double& e : r.schedule.end_s) e *= k;
        for (double& e : r.schedule.chunk_grads_ready_s) e *= k;
        r.schedule.makespan_s = makespan;
    }

    // Gradient sync, optimizer and parameter gather per stage.
    const bool sharded = o.memory.distributed_optimizer;
    const double grad_reduce_bytes = o.memory.optimizer.main_grad_bytes;
    // Megatron-LM gathers fp8 primary weights in fp8 (--fp8-param-gather), others in the
    // model's weight format (bf16; fp32 with fp32 GEMMs).
    const double gather_bytes =
        o.precision == Precision::fp8 && o.memory.low_precision_primary_weights
            ? 1.0
            : high_precision_bytes(o.precision);
    std::vector<double> rs_end(pp), opt_s(pp), ag_exposed(pp), dp_interference(pp);
    // When each chunk's last backward starts and ends: its gradients become final layer by
    // layer in between, and Megatron-LM launches each bucket's reduce-scatter then, so only the
    // last bucket (about one layer) can trail the backward pass.
    std::vector<double> last_bwd_start(chunks, 0), last_bwd_end(chunks, 0);
    for (int64_t s = 0; s < pp; ++s) {
        for (const ScheduledTask& t : r.schedule.stages[s]) {
            if (t.kind == TaskKind::forward) continue;
            if (t.end_s >= last_bwd_end[t.chunk_b]) {
                last_bwd_end[t.chunk_b] = t.end_s;
                last_bwd_start[t.chunk_b] = t.start_s;
            }
        }
    }
    auto layers_in = [&](int64_t g) {
        return static_cast<double>(std::max<size_t>(1, groups[g].size()));
    };
    for (int64_t s = 0; s < pp; ++s) {
        std::vector<std::pair<double, int64_t>> ready;
        for (int64_t g : chunks_of_stage(s)) {
            ready.push_back({o.overlap_dp_grad ? last_bwd_start[g] : r.schedule.end_s[s], g});
        }
        std::sort(ready.begin(), ready.end());
        double free_at = 0, hidden = 0, shard = 0;
        for (const auto& [t, g] : ready) {
            // The distributed optimizer reduce-scatters gradients; without it they are
            // all-reduced and every rank updates all of its parameters.
            auto grad_sync = [&](const GroupPlacement& group, double bytes) {
                return sharded ? reduce_scatter_cost(cluster, group, bytes).time_s
                               : all_reduce_cost(cluster, group, bytes).time_s;
            };
            const double rs = grad_sync(ctx.placement.dp, cc[g].params.dense * grad_reduce_bytes) +
                              grad_sync(ctx.placement.edp, cc[g].params.expert * grad_reduce_bytes);
            const double start = std::max(free_at, t);
            const double last_bucket =
                o.overlap_dp_grad ? last_bwd_end[g] + rs / layers_in(g) : start + rs;
            free_at = std::max(start + rs, last_bucket);
            // The collective runs rs of the time between its start and the end of the compute
            // (not the whole window: a small sync waits for the last bucket, idle meanwhile).
            hidden += std::min(rs, std::max(0.0, std::min(free_at, r.schedule.end_s[s]) - start));
            shard += sharded ? cc[g].params.dense / static_cast<double>(layout.dp) +
                                   cc[g].params.expert /
                                       static_cast<double>(std::max<int64_t>(1, layout.edp()))
                             : cc[g].params.dense + cc[g].params.expert;
        }
        if (dualpipe) shard /= 2;  // each stage's state is shared by its two copies
        rs_end[s] = std::max(free_at, r.schedule.end_s[s]);
        dp_interference[s] = f_sm * hidden;
        opt_s[s] = shard * optimizer_bytes_per_param(o.memory.optimizer) /
                       (cluster.gpu.hbm_bytes_per_s * cluster.efficiency.memory_bw) +
                   kOptimizerKernels * (cluster.efficiency.kernel_host_overhead_s +
                                        cluster.efficiency.kernel_gpu_overhead_s);
        // The next step's forward needs chunk s's first bucket gathered; with overlap the rest
        // arrives behind the forward of the layers before it.
        double ag_total = 0, ag_first = 0;
        for (int64_t g : chunks_of_stage(s)) {
            const double ag =
                all_gather_cost(cluster, ctx.placement.dp, cc[g].params.dense * gather_bytes)
                    .time_s +
                all_gather_cost(cluster, ctx.placement.edp, cc[g].params.expert * gather_bytes)
                    .time_s;
            if (ag_total == 0) ag_first = ag / layers_in(g);
            ag_total += ag;
        }
        ag_exposed[s] = !sharded ? 0.0 : o.overlap_dp_param ? ag_first : ag_total;
    }
    // The step waits for the last stage to finish its gradient sync; the breakdown describes
    // the busiest stage (the one the pipeline runs at the pace of).
    double compute_end = 0;
    for (int64_t s = 0; s < pp; ++s)
        compute_end = std::max(compute_end, rs_end[s] + dp_interference[s]);
    const int64_t critical = std::max_element(r.schedule.busy_s.begin(), r.schedule.busy_s.end()) -
                             r.schedule.busy_s.begin();
    const double opt_max = *std::max_element(opt_s.begin(), opt_s.end());
    const double ag_max = *std::max_element(ag_exposed.begin(), ag_exposed.end());
    // Every step synchronizes all GPUs (EP all-to-alls per layer, DP collectives per step), so
    // it runs at the pace of the slowest GPU.
    const double synchronized_s = compute_end + opt_max + ag_max;
    const SlowestOfN slow =
        slowest_of_n(cluster.efficiency.variability, r.gpus, layout.ep, synchronized_s);
    r.step_time_s = synchronized_s * (1 + slow.total());
    r.dp_end_s = compute_end;
    r.optimizer_end_s = compute_end + opt_max;
    r.critical_stage = critical;

    // Breakdown of the critical stage: its tasks, then what the step adds around them.
    TimeBreakdown bd;
    for (const ScheduledTask& t : r.schedule.stages[critical]) {
        if (t.kind == TaskKind::forward) {
            bd.add(cc[t.chunk_f].fwd.parts);
        } else if (t.kind == TaskKind::backward) {
            bd.add(zero_bubble ? cc[t.chunk_b].bwd_input.parts : cc[t.chunk_b].bwd.parts);
        } else if (t.kind == TaskKind::weight_gradient) {
            bd.add(cc[t.chunk_b].bwd_weight.parts);
        } else {
            bd.add(cc[t.chunk_f].fwd_deferred.parts);
            bd.add(cc[t.chunk_b].bwd_deferred.parts);
            bd.ep_exposed_s += merged(t.chunk_f, t.chunk_b) - (cc[t.chunk_f].fwd_deferred.time_s +
                                                               cc[t.chunk_b].bwd_deferred.time_s);
        }
    }
    bd.dp_exposed_s =
        (rs_end[critical] - r.schedule.end_s[critical]) + dp_interference[critical] + ag_max;
    bd.optimizer_s = opt_max;
    bd.ep_jitter_s = synchronized_s * slow.ep_jitter;
    bd.dp_jitter_s = synchronized_s * slow.dp_jitter;
    bd.straggler_s = synchronized_s * slow.stragglers;
    bd.pp_bubble_s = std::max(0.0, r.step_time_s - bd.total_s());
    r.breakdown = bd;

    // Memory per stage: static parts plus the peak of activations in flight.
    r.memory_per_stage.resize(pp);
    for (int64_t s = 0; s < pp; ++s) {
        BlockParams sp;
        bool has_head = false, has_moe = false;
        for (int64_t g : chunks_of_stage(s)) {
            sp.dense += cc[g].params.dense;
            sp.expert += cc[g].params.expert;
            for (const ChunkBlock& it : groups[g]) {
                has_head = has_head || it.kind == BlockKind::output_head;
                has_moe = has_moe || it.kind == BlockKind::moe_layer;
            }
        }
        // DualPipe's two copies of each stage share its optimizer state: sharded over 2 dp.
        parallel::Layout sharding = layout;
        if (dualpipe) sharding.dp *= 2;
        MemoryBreakdown mb =
            static_memory(sp, sharding, o.precision, o.memory, cluster.gpu.hbm_bytes);
        mb.stage = s;
        // Activations in flight follow the schedule's own task order; offloaded ones wait in
        // host memory, but two blocks' worth is on the GPU at a time (one being copied out
        // behind the forward, one copied back ahead of its backward).
        double cur = 0, peak = 0, offloaded = 0, offloaded_at_peak = 0, staging = 0;
        // With zero bubble, B frees them but a deferred W keeps its GEMM inputs and the output
        // gradients until it runs.
        for (const ScheduledTask& t : r.schedule.stages[s]) {
            if (t.kind == TaskKind::forward || t.kind == TaskKind::forward_backward) {
                cur += cc[t.chunk_f].saved_bytes;
                offloaded += cc[t.chunk_f].offloaded_bytes;
                staging = std::max(staging, 2 * cc[t.chunk_f].largest_offloaded_block_bytes);
            }
            if (cur >= peak) {
                peak = cur;
                offloaded_at_peak = offloaded;
            }
            if (t.kind == TaskKind::backward || t.kind == TaskKind::forward_backward) {
                cur -= cc[t.chunk_b].saved_bytes;
                offloaded -= cc[t.chunk_b].offloaded_bytes;
                if (zero_bubble) cur += cc[t.chunk_b].weight_gradient_input_bytes;
            }
            if (t.kind == TaskKind::weight_gradient) {
                cur -= cc[t.chunk_b].weight_gradient_input_bytes;
            }
        }
        if (dualpipe) {
            // pp + 1 micro-batches of one stage in flight on every rank (the report's Table 2),
            // half of each direction's chunk.
            const double per_micro = (cc[s].saved_bytes + cc[pp - 1 - s].saved_bytes) / 2;
            // Its cool-down defers W (DeepSeek's reference dualpipe.py, steps 6-8): from the
            // middle of step 6, with pp/2 micro-batches' chunks still to go backward, each B
            // runs without W, until h + 1 W's are pending (h = min(s, pp-1-s); step 8 runs
            // them); step 7 runs one W per B. Each deferred B trades a micro-batch's
            // activations for its W inputs, so the cool-down peaks at either end of step 6.
            const double pending_w =
                (cc[s].weight_gradient_input_bytes + cc[pp - 1 - s].weight_gradient_input_bytes) /
                2;
            const double deferred = static_cast<double>(std::min(s, pp - 1 - s) + 1);
            const double half = static_cast<double>(pp / 2);
            peak = std::max(static_cast<double>(pp + 1) * per_micro,
                            (half - deferred) * per_micro + deferred * pending_w);
        }
        mb.activations_bytes = peak + staging;
        mb.offloaded_bytes = offloaded_at_peak;
        const double tokens =
            static_cast<double>(o.micro_batch * o.seq_len) / static_cast<double>(layout.cp);
        const double d_model = static_cast<double>(model.hidden_size);
        const double act_bytes = high_precision_bytes(o.precision);
        if (has_moe) {
            // Dispatch receive and combine send buffers of the expert rows.
            const double rows = tokens / static_cast<double>(layout.tp) *
                                static_cast<double>(model.num_experts_per_tok);
            mb.comm_buffers_bytes += 2 * rows * d_model * act_bytes;
        }
        if (layout.tp > 1) mb.comm_buffers_bytes += 2 * tokens * d_model * act_bytes;
        if (has_head) {
            // Logits and their gradient for the cross-entropy, live at the same time.
            mb.comm_buffers_bytes += 2 * tokens * static_cast<double>(model.vocab_size) /
                                     static_cast<double>(layout.tp) * act_bytes;
        }
        r.memory_per_stage[s] = mb;
    }
    r.memory = *std::max_element(r.memory_per_stage.begin(), r.memory_per_stage.end(),
                                 [](const MemoryBreakdown& a, const MemoryBreakdown& b) {
                                     return a.total_bytes() < b.total_bytes();
                                 });

    // Throughput in the Megatron-LM FLOP convention.
    r.model_flops_per_token = flops_per_token(model, o.seq_len, with_mtp).total;
    const double tokens_per_step = static_cast<double>(o.global_batch * o.seq_len);
    r.tokens_per_s_per_gpu = tokens_per_step / r.step_time_s / static_cast<double>(r.gpus);
    r.tflops_per_gpu = r.tokens_per_s_per_gpu * r.model_flops_per_token / 1e12;
    r.mfu = r.tflops_per_gpu * 1e12 / cluster.peak_flops(o.precision);

    // One MoE (or dense) layer's forward and backward timeline, for the SVG.
    const BlockKind shown =
        model.n_routed_experts > 0 ? BlockKind::moe_layer : BlockKind::dense_layer;
    OpList f, b;
    f.append(blocks[shown].forward);
    b.append(recomputed[shown].backward);
    r.moe_layer_forward = walk_ops(cluster, f, wo, false, true).events;
    r.moe_layer_backward = walk_ops(cluster, b, wo, false, true).events;
    return r;
}

}  // namespace moetron::sim
