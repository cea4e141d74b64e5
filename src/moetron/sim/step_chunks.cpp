// What each block and each pipeline chunk of a step costs, which blocks each chunk holds, and
// the pipeline schedule over the chunks (step_phases.h).
#include <algorithm>
#include <initializer_list>

#include "moetron/core/user_error.h"
#include "moetron/sim/collectives.h"
#include "moetron/sim/step_phases.h"

namespace moetron::sim::step_phases {

namespace {

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

// Forward and backward op lists walked every way the schedules run them.
Walks walk_all(const ClusterSpec& cluster, const WalkOptions& wo, const OpList& forward,
               const OpList& backward, const OpList& backward_input,
               const OpList& backward_weight) {
    Walks w;
    w.bwd_input = walk_ops(cluster, backward_input, wo, false, false);
    w.bwd_weight = walk_ops(cluster, backward_weight, wo, false, false);
    w.fwd = walk_ops(cluster, forward, wo, false, false);
    w.bwd = walk_ops(cluster, backward, wo, false, false);
    w.fwd_deferred = walk_ops(cluster, forward, wo, true, false);
    w.bwd_deferred = walk_ops(cluster, backward, wo, true, false);
    return w;
}

WalkOptions walk_options(const SimOptions& o) {
    return {o.cuda_graphs, o.overlap_tp};
}

// The model's blocks in order, each with its stand-alone cost: embedding, layers, head, then
// each MTP depth's extra block and layer.
std::vector<ChunkBlock> model_blocks(const ModelConfig& model, bool with_mtp,
                                     const std::map<BlockKind, double>& cost_s) {
    std::vector<ChunkBlock> items;
    items.push_back({BlockKind::embedding, -1, cost_s.at(BlockKind::embedding)});
    for (int64_t i = 0; i < model.num_hidden_layers; ++i) {
        const BlockKind k = model.is_moe_layer(i) ? BlockKind::moe_layer : BlockKind::dense_layer;
        items.push_back({k, static_cast<int>(i), cost_s.at(k)});
    }
    items.push_back({BlockKind::output_head, -1, cost_s.at(BlockKind::output_head)});
    for (int64_t d = 0; with_mtp && d < model.num_nextn_predict_layers; ++d) {
        items.push_back({BlockKind::mtp_extra, -1, cost_s.at(BlockKind::mtp_extra)});
        const BlockKind k = model.mtp_layer_is_moe(d) && model.n_routed_experts > 0
                                ? BlockKind::moe_layer
                                : BlockKind::dense_layer;
        items.push_back({k, -1, cost_s.at(k)});
    }
    return items;
}

// Each chunk's times as the sums of its blocks' (the chunk layout's estimate: no walk of the
// whole chunk, whose host and overlap effects span the blocks).
std::vector<Walks> summed_block_walks(const ChunkGroups& groups, const BlockCosts& blocks) {
    std::vector<Walks> sums(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
        for (const ChunkBlock& it : groups[g]) {
            const Walks& w = blocks.walks.at(it.kind);
            Walks& s = sums[g];
            s.fwd.time_s += w.fwd.time_s;
            s.bwd.time_s += w.bwd.time_s;
            s.fwd_deferred.time_s += w.fwd_deferred.time_s;
            s.bwd_deferred.time_s += w.bwd_deferred.time_s;
            s.fwd_deferred.ep_comm_s += w.fwd_deferred.ep_comm_s;
            s.bwd_deferred.ep_comm_s += w.bwd_deferred.ep_comm_s;
            s.bwd_input.time_s += w.bwd_input.time_s;
            s.bwd_weight.time_s += w.bwd_weight.time_s;
        }
    }
    return sums;
}

// The event simulation of the schedule over the chunks' walks.
ScheduleResult run_pipeline(const std::vector<Walks>& chunks, const PipelineShape& shape) {
    ScheduleInput in;
    in.pp = shape.pp;
    in.vpp = shape.vpp;
    in.micro_batches = shape.micro_batches;
    in.merge_steady_state = shape.merge_steady_state;
    in.schedule = shape.simulated;
    in.forward_s = [&](int64_t g) { return chunks[g].fwd.time_s; };
    in.backward_s = [&](int64_t g) {
        return shape.zero_bubble ? chunks[g].bwd_input.time_s : chunks[g].bwd.time_s;
    };
    in.weight_gradient_s = [&](int64_t g) { return chunks[g].bwd_weight.time_s; };
    in.forward_backward_s = [&](int64_t gf, int64_t gb) {
        return forward_backward_s(chunks[gf], chunks[gb], shape.comm_sm_fraction);
    };
    in.p2p_s = shape.p2p_s;
    return run_schedule(in);
}

// DualPipe's makespan: rank s pairs forwards of one direction with backwards of the other, so
// its F&B is the mean of its two chunks' pairings, B and W the means of their parts.
double dualpipe_makespan(const std::vector<Walks>& chunks, const PipelineShape& shape) {
    const double f_sm = shape.comm_sm_fraction;
    double makespan = 0;
    for (int64_t s = 0; s < shape.pp; ++s) {
        const Walks& a = chunks[s];
        const Walks& b = chunks[shape.pp - 1 - s];
        const double fb = (forward_backward_s(a, b, f_sm) + forward_backward_s(b, a, f_sm)) / 2;
        const double bi = (a.bwd_input.time_s + b.bwd_input.time_s) / 2;
        const double w = (a.bwd_weight.time_s + b.bwd_weight.time_s) / 2;
        makespan =
            std::max(makespan, dualpipe_makespan_s(shape.pp, shape.micro_batches, fb, bi, w));
    }
    return makespan;
}

// Stretches the stand-in's timeline to DualPipe's makespan (DP overlap and the SVG read task
// times).
void stretch_to(ScheduleResult& schedule, double makespan_s) {
    const double k = makespan_s / schedule.makespan_s;
    for (auto& stage : schedule.stages) {
        for (ScheduledTask& t : stage) {
            t.start_s *= k;
            t.end_s *= k;
        }
    }
    for (double& e : schedule.end_s) e *= k;
    for (double& e : schedule.chunk_grads_ready_s) e *= k;
    schedule.makespan_s = makespan_s;
}

}  // namespace

std::vector<int64_t> PipelineShape::chunks_of_stage(int64_t stage) const {
    std::vector<int64_t> out;
    for (int64_t c = 0; c < vpp; ++c) out.push_back(c * pp + stage);
    if (dualpipe) out.push_back(pp - 1 - stage);
    return out;
}

PipelineShape pipeline_shape(const OpContext& ctx, const SimOptions& o, int64_t micro_batches) {
    const ModelConfig& model = *ctx.model;
    const parallel::Layout& layout = ctx.layout;
    PipelineShape shape;
    shape.pp = layout.pp;
    shape.vpp = layout.vpp;
    shape.chunks = layout.pp * layout.vpp;
    shape.micro_batches = micro_batches;
    shape.zero_bubble = o.pipeline_schedule == PipelineSchedule::zero_bubble_h1;
    shape.dualpipe = o.pipeline_schedule == PipelineSchedule::dualpipe;
    shape.simulated = shape.dualpipe ? PipelineSchedule::one_f_one_b : o.pipeline_schedule;
    const bool merge = o.combined_1f1b() && model.n_routed_experts > 0 && layout.ep > 1;
    shape.merge_steady_state = merge || shape.dualpipe;
    const double act_bytes = static_cast<double>(o.micro_batch * o.seq_len) /
                             static_cast<double>(layout.tp * layout.cp) *
                             static_cast<double>(model.hidden_size) *
                             high_precision_bytes(o.precision);
    shape.p2p_s = send_recv_cost(*ctx.cluster, ctx.placement.pp.domains > 1, act_bytes).time_s;
    shape.comm_sm_fraction = ctx.cluster->efficiency.comm_sm_fraction;
    return shape;
}

double forward_backward_s(const Walks& forward, const Walks& backward, double comm_sm_fraction) {
    const double compute = forward.fwd_deferred.time_s + backward.bwd_deferred.time_s;
    const double comm = forward.fwd_deferred.ep_comm_s + backward.bwd_deferred.ep_comm_s;
    return std::max(compute + comm_sm_fraction * comm, comm);
}

BlockCosts block_costs(const OpContext& ctx, const SimOptions& o, bool with_mtp) {
    const ClusterSpec& cluster = *ctx.cluster;
    const WalkOptions wo = walk_options(o);
    std::vector<BlockKind> kinds = {BlockKind::dense_layer, BlockKind::embedding,
                                    BlockKind::output_head};
    if (ctx.model->n_routed_experts > 0) kinds.push_back(BlockKind::moe_layer);
    if (with_mtp) kinds.push_back(BlockKind::mtp_extra);
    BlockCosts b;
    for (BlockKind k : kinds) {
        b.ops[k] = build_block_ops(ctx, k);
        b.recomputed[k] = apply_recompute(b.ops[k], o.recompute, o.memory.offload);
        OpList f, bwd, bwd_input, bwd_weight;
        f.append(b.ops[k].forward);
        bwd.append(b.recomputed[k].backward);
        bwd_input.append_part(b.recomputed[k].backward, false);
        bwd_weight.append_part(b.recomputed[k].backward, true);
        const Walks& w = b.walks[k] = walk_all(cluster, wo, f, bwd, bwd_input, bwd_weight);
        // With EP overlap a block mostly runs inside combined forward-backward tasks.
        b.cost_s[k] = o.combined_1f1b()
                          ? forward_backward_s(w, w, cluster.efficiency.comm_sm_fraction)
                          : w.fwd.time_s + w.bwd.time_s;
    }
    return b;
}

ChunkGroups chunk_layout(const ModelConfig& model, const SimOptions& o, bool with_mtp,
                         const BlockCosts& blocks, const PipelineShape& shape) {
    if (!o.pipeline_layout.empty()) {
        return layout_items(model, o.pipeline_layout, shape.chunks, with_mtp, blocks.cost_s);
    }
    // Two layouts: chunks of equal cost, and chunks shifted so that stages have equal cost.
    // Keep the one whose schedule (on summed block times) ends first.
    ChunkGroups groups =
        partition_items(model_blocks(model, with_mtp, blocks.cost_s), shape.chunks);
    ChunkGroups balanced = groups;
    balance_stages(balanced, shape.pp);
    auto makespan = [&](const ChunkGroups& g) {
        return run_pipeline(summed_block_walks(g, blocks), shape).makespan_s;
    };
    if (makespan(balanced) < makespan(groups)) groups = std::move(balanced);
    return groups;
}

ChunkCosts chunk_costs(const OpContext& ctx, const SimOptions& o, const BlockCosts& blocks,
                       const ChunkGroups& groups) {
    const WalkOptions wo = walk_options(o);
    ChunkCosts cc;
    cc.walks.resize(groups.size());
    cc.footprint.resize(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
        ChunkFootprint& fp = cc.footprint[g];
        OpList f, b, bi, bw;
        for (const ChunkBlock& it : groups[g]) {
            const RecomputedBlock& rb = blocks.recomputed.at(it.kind);
            f.append(blocks.ops.at(it.kind).forward);
            fp.saved_bytes += rb.saved_bytes;
            fp.offloaded_bytes += rb.offloaded_bytes;
            fp.weight_gradient_input_bytes += rb.weight_gradient_input_bytes;
            fp.largest_offloaded_block_bytes =
                std::max(fp.largest_offloaded_block_bytes, rb.offloaded_bytes);
            const BlockParams bp =
                block_params_per_gpu(*ctx.model, it.kind, ctx.layout, o.redundant_experts);
            fp.params.dense += bp.dense;
            fp.params.expert += bp.expert;
        }
        for (auto it = groups[g].rbegin(); it != groups[g].rend(); ++it) {
            const RecomputedBlock& rb = blocks.recomputed.at(it->kind);
            b.append(rb.backward);
            bi.append_part(rb.backward, false);
            bw.append_part(rb.backward, true);
        }
        Walks& w = cc.walks[g] = walk_all(*ctx.cluster, wo, f, b, bi, bw);
        add_offload_copies(*ctx.cluster, fp.offloaded_bytes,
                           {&w.fwd, &w.fwd_deferred, &w.bwd, &w.bwd_deferred, &w.bwd_input});
    }
    return cc;
}

ScheduleResult pipeline_schedule(const std::vector<Walks>& chunks, const PipelineShape& shape) {
    ScheduleResult schedule = run_pipeline(chunks, shape);
    if (shape.dualpipe) stretch_to(schedule, dualpipe_makespan(chunks, shape));
    return schedule;
}

}  // namespace moetron::sim::step_phases
