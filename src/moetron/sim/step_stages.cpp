// Per pipeline stage, what a step adds around the schedule: the data-parallel gradient sync, the
// optimizer and the next step's parameter gather; the step's time and its critical stage's
// breakdown; and each stage's memory (step_phases.h).
#include <algorithm>
#include <utility>

#include "moetron/sim/collectives.h"
#include "moetron/sim/step_phases.h"

namespace moetron::sim::step_phases {

namespace {

constexpr int kOptimizerKernels = 100;  // multi-tensor Adam, grad norm and clipping launches

// Optimizer HBM traffic per sharded parameter: the main gradient read twice (gradient norm,
// then the update), the main parameter and both moments read and written (24 bytes with fp32
// gradients and parameters and bf16 moments).
double optimizer_bytes_per_param(const OptimizerPrecision& p) {
    return 2 * p.main_grad_bytes + 2 * p.state_bytes();
}

// When each chunk's last backward starts and ends: its gradients become final layer by layer in
// between, and Megatron-LM launches each bucket's reduce-scatter then, so only the last bucket
// (about one layer) can trail the backward pass.
struct LastBackwards {
    std::vector<double> start_s, end_s;  // by global chunk
};

LastBackwards last_backwards(const ScheduleResult& schedule, int64_t chunks) {
    LastBackwards last{std::vector<double>(chunks, 0), std::vector<double>(chunks, 0)};
    for (const std::vector<ScheduledTask>& stage : schedule.stages) {
        for (const ScheduledTask& t : stage) {
            if (t.kind == TaskKind::forward) continue;
            if (t.end_s >= last.end_s[t.chunk_b]) {
                last.end_s[t.chunk_b] = t.end_s;
                last.start_s[t.chunk_b] = t.start_s;
            }
        }
    }
    return last;
}

// A chunk's layers (at least one): its gradient buckets, and its parameters' gather pieces.
double layers_in(const ChunkGroups& groups, int64_t g) {
    return static_cast<double>(std::max<size_t>(1, groups[g].size()));
}

// The stage's chunks in the order their gradients become ready to sync: with overlap, when their
// last backward starts; without it, all at the end of the stage's compute.
std::vector<std::pair<double, int64_t>> sync_order(const SimOptions& o, const PipelineShape& shape,
                                                   const ScheduleResult& schedule,
                                                   const LastBackwards& last, int64_t stage) {
    std::vector<std::pair<double, int64_t>> ready;
    for (int64_t g : shape.chunks_of_stage(stage)) {
        ready.push_back({o.overlap_dp_grad ? last.start_s[g] : schedule.end_s[stage], g});
    }
    std::sort(ready.begin(), ready.end());
    return ready;
}

// The stage's gradient collectives, one chunk after another: when the last one ends, and how
// long they ran beside the stage's compute.
struct GradientSync {
    double end_s = 0;
    double beside_compute_s = 0;
};

GradientSync gradient_sync(const OpContext& ctx, const SimOptions& o,
                           const std::vector<std::pair<double, int64_t>>& ready,
                           double compute_end_s, const LastBackwards& last,
                           const ChunkCosts& chunks, const ChunkGroups& groups) {
    const bool sharded = o.memory.distributed_optimizer;
    const double grad_reduce_bytes = o.memory.optimizer.main_grad_bytes;
    // The distributed optimizer reduce-scatters gradients; without it they are all-reduced and
    // every rank updates all of its parameters.
    auto collective_s = [&](const GroupPlacement& group, double bytes) {
        return sharded ? reduce_scatter_cost(*ctx.cluster, group, bytes).time_s
                       : all_reduce_cost(*ctx.cluster, group, bytes).time_s;
    };
    double free_at = 0, hidden = 0;
    for (const auto& [t, g] : ready) {
        const BlockParams& params = chunks.footprint[g].params;
        const double rs = collective_s(ctx.placement.dp, params.dense * grad_reduce_bytes) +
                          collective_s(ctx.placement.edp, params.expert * grad_reduce_bytes);
        const double start = std::max(free_at, t);
        const double last_bucket =
            o.overlap_dp_grad ? last.end_s[g] + rs / layers_in(groups, g) : start + rs;
        free_at = std::max(start + rs, last_bucket);
        // The collective runs rs of the time between its start and the end of the compute (not
        // the whole window: a small sync waits for the last bucket, idle meanwhile).
        hidden += std::min(rs, std::max(0.0, std::min(free_at, compute_end_s) - start));
    }
    return {free_at, hidden};
}

// The parameters the stage's optimizer updates: its shard with the distributed optimizer, all
// of them without.
double optimizer_params(const OpContext& ctx, const SimOptions& o, const PipelineShape& shape,
                        const std::vector<std::pair<double, int64_t>>& ready,
                        const ChunkCosts& chunks) {
    const parallel::Layout& layout = ctx.layout;
    double shard = 0;
    for (const auto& entry : ready) {
        const BlockParams& params = chunks.footprint[entry.second].params;
        shard += o.memory.distributed_optimizer
                     ? params.dense / static_cast<double>(layout.dp) +
                           params.expert / static_cast<double>(std::max<int64_t>(1, layout.edp()))
                     : params.dense + params.expert;
    }
    if (shape.dualpipe) shard /= 2;  // each stage's state is shared by its two copies
    return shard;
}

double optimizer_time_s(const ClusterSpec& cluster, const SimOptions& o, double params) {
    return params * optimizer_bytes_per_param(o.memory.optimizer) /
               (cluster.gpu.hbm_bytes_per_s * cluster.efficiency.memory_bw) +
           kOptimizerKernels * (cluster.efficiency.kernel_host_overhead_s +
                                cluster.efficiency.kernel_gpu_overhead_s);
}

// The distributed optimizer gathers the updated parameters. The next step's forward needs the
// stage's first bucket gathered; with overlap the rest arrives behind the forward of the layers
// before it.
double param_gather_exposed_s(const OpContext& ctx, const SimOptions& o, const PipelineShape& shape,
                              int64_t stage, const ChunkCosts& chunks, const ChunkGroups& groups) {
    if (!o.memory.distributed_optimizer) return 0.0;
    // Megatron-LM gathers fp8 primary weights in fp8 (--fp8-param-gather), others in the
    // model's weight format (bf16; fp32 with fp32 GEMMs).
    const double gather_bytes =
        o.precision == Precision::fp8_blockwise && o.memory.low_precision_primary_weights
            ? 1.0
            : high_precision_bytes(o.precision);
    double total = 0, first = 0;
    for (int64_t g : shape.chunks_of_stage(stage)) {
        const BlockParams& params = chunks.footprint[g].params;
        const double ag =
            all_gather_cost(*ctx.cluster, ctx.placement.dp, params.dense * gather_bytes).time_s +
            all_gather_cost(*ctx.cluster, ctx.placement.edp, params.expert * gather_bytes).time_s;
        if (total == 0) first = ag / layers_in(groups, g);
        total += ag;
    }
    return o.overlap_dp_param ? first : total;
}

// The activations of one stage in flight, in the schedule's own task order.
struct ActivationPeak {
    double peak_bytes = 0;
    double offloaded_at_peak_bytes = 0;
    // Offloaded activations wait in host memory, but two blocks' worth is on the GPU at a time
    // (one being copied out behind the forward, one copied back ahead of its backward).
    double staging_bytes = 0;
};

ActivationPeak activation_peak(const PipelineShape& shape, const std::vector<ScheduledTask>& tasks,
                               const ChunkCosts& chunks) {
    const std::vector<ChunkFootprint>& fp = chunks.footprint;
    ActivationPeak a;
    double cur = 0, offloaded = 0;
    // With zero bubble, B frees them but a deferred W keeps its GEMM inputs and the output
    // gradients until it runs.
    for (const ScheduledTask& t : tasks) {
        if (t.kind == TaskKind::forward || t.kind == TaskKind::forward_backward) {
            cur += fp[t.chunk_f].saved_bytes;
            offloaded += fp[t.chunk_f].offloaded_bytes;
            a.staging_bytes =
                std::max(a.staging_bytes, 2 * fp[t.chunk_f].largest_offloaded_block_bytes);
        }
        if (cur >= a.peak_bytes) {
            a.peak_bytes = cur;
            a.offloaded_at_peak_bytes = offloaded;
        }
        if (t.kind == TaskKind::backward || t.kind == TaskKind::forward_backward) {
            cur -= fp[t.chunk_b].saved_bytes;
            offloaded -= fp[t.chunk_b].offloaded_bytes;
            if (shape.zero_bubble) cur += fp[t.chunk_b].weight_gradient_input_bytes;
        }
        if (t.kind == TaskKind::weight_gradient) {
            cur -= fp[t.chunk_b].weight_gradient_input_bytes;
        }
    }
    return a;
}

// DualPipe keeps pp + 1 micro-batches of one stage in flight on every rank (the report's Table
// 2), half of each direction's chunk.
double dualpipe_activation_peak_bytes(const PipelineShape& shape, int64_t s,
                                      const ChunkCosts& chunks) {
    const int64_t pp = shape.pp;
    const ChunkFootprint& a = chunks.footprint[s];
    const ChunkFootprint& b = chunks.footprint[pp - 1 - s];
    const double per_micro = (a.saved_bytes + b.saved_bytes) / 2;
    // Its cool-down defers W (DeepSeek's reference dualpipe.py, steps 6-8): from the middle of
    // step 6, with pp/2 micro-batches' chunks still to go backward, each B runs without W, until
    // h + 1 W's are pending (h = min(s, pp-1-s); step 8 runs them); step 7 runs one W per B.
    // Each deferred B trades a micro-batch's activations for its W inputs, so the cool-down
    // peaks at either end of step 6.
    const double pending_w = (a.weight_gradient_input_bytes + b.weight_gradient_input_bytes) / 2;
    const double deferred = static_cast<double>(std::min(s, pp - 1 - s) + 1);
    const double half = static_cast<double>(pp / 2);
    return std::max(static_cast<double>(pp + 1) * per_micro,
                    (half - deferred) * per_micro + deferred * pending_w);
}

// Which blocks a stage's chunks hold that bring buffers of their own.
struct StageBlocks {
    BlockParams params;
    bool has_head = false, has_moe = false;
};

StageBlocks stage_blocks(const PipelineShape& shape, int64_t s, const ChunkCosts& chunks,
                         const ChunkGroups& groups) {
    StageBlocks sb;
    for (int64_t g : shape.chunks_of_stage(s)) {
        sb.params.dense += chunks.footprint[g].params.dense;
        sb.params.expert += chunks.footprint[g].params.expert;
        for (const ChunkBlock& it : groups[g]) {
            sb.has_head = sb.has_head || it.kind == BlockKind::output_head;
            sb.has_moe = sb.has_moe || it.kind == BlockKind::moe_layer;
        }
    }
    return sb;
}

void add_comm_buffers(MemoryBreakdown& mb, const ModelConfig& model, const parallel::Layout& layout,
                      const SimOptions& o, const StageBlocks& blocks) {
    const double tokens =
        static_cast<double>(o.micro_batch * o.seq_len) / static_cast<double>(layout.cp);
    const double d_model = static_cast<double>(model.hidden_size);
    const double act_bytes = high_precision_bytes(o.precision);
    if (blocks.has_moe) {
        // Dispatch receive and combine send buffers of the expert rows.
        const double rows = tokens / static_cast<double>(layout.tp) *
                            static_cast<double>(model.num_experts_per_tok);
        mb.comm_buffers_bytes += 2 * rows * d_model * act_bytes;
    }
    if (layout.tp > 1) mb.comm_buffers_bytes += 2 * tokens * d_model * act_bytes;
    if (blocks.has_head) {
        // Logits and their gradient for the cross-entropy, live at the same time.
        mb.comm_buffers_bytes += 2 * tokens * static_cast<double>(model.vocab_size) /
                                 static_cast<double>(layout.tp) * act_bytes;
    }
}

}  // namespace

std::vector<StageSync> data_parallel_sync(const OpContext& ctx, const SimOptions& o,
                                          const PipelineShape& shape,
                                          const ScheduleResult& schedule, const ChunkCosts& chunks,
                                          const ChunkGroups& groups) {
    const LastBackwards last = last_backwards(schedule, shape.chunks);
    std::vector<StageSync> stages(shape.pp);
    for (int64_t s = 0; s < shape.pp; ++s) {
        const double compute_end_s = schedule.end_s[s];
        const std::vector<std::pair<double, int64_t>> ready =
            sync_order(o, shape, schedule, last, s);
        const GradientSync sync = gradient_sync(ctx, o, ready, compute_end_s, last, chunks, groups);
        StageSync& st = stages[s];
        st.grads_synced_s = std::max(sync.end_s, compute_end_s);
        st.interference_s = shape.comm_sm_fraction * sync.beside_compute_s;
        st.optimizer_s =
            optimizer_time_s(*ctx.cluster, o, optimizer_params(ctx, o, shape, ready, chunks));
        st.param_gather_exposed_s = param_gather_exposed_s(ctx, o, shape, s, chunks, groups);
    }
    return stages;
}

StepTime step_time(const ClusterSpec& cluster, const parallel::Layout& layout,
                   const std::vector<StageSync>& stages) {
    // The step waits for the last stage to finish its gradient sync, and for the slowest
    // stage's optimizer and parameter gather.
    StepTime t;
    t.optimizer_s = stages.front().optimizer_s;
    t.param_gather_s = stages.front().param_gather_exposed_s;
    for (const StageSync& s : stages) {
        t.compute_end_s = std::max(t.compute_end_s, s.grads_synced_s + s.interference_s);
        t.optimizer_s = std::max(t.optimizer_s, s.optimizer_s);
        t.param_gather_s = std::max(t.param_gather_s, s.param_gather_exposed_s);
    }
    // Every step synchronizes all GPUs (EP all-to-alls per layer, DP collectives per step), so
    // it runs at the pace of the slowest GPU.
    t.synchronized_s = t.compute_end_s + t.optimizer_s + t.param_gather_s;
    t.slowest = slowest_of_n(cluster.efficiency.variability, layout.world_size(), layout.ep,
                             t.synchronized_s);
    return t;
}

TimeBreakdown critical_stage_breakdown(const StepResult& r, const PipelineShape& shape,
                                       const ChunkCosts& chunks, const StageSync& critical,
                                       const StepTime& time) {
    const std::vector<Walks>& w = chunks.walks;
    TimeBreakdown bd;
    for (const ScheduledTask& t : r.schedule.stages[r.critical_stage]) {
        if (t.kind == TaskKind::forward) {
            bd.add(w[t.chunk_f].fwd.parts);
        } else if (t.kind == TaskKind::backward) {
            bd.add(shape.zero_bubble ? w[t.chunk_b].bwd_input.parts : w[t.chunk_b].bwd.parts);
        } else if (t.kind == TaskKind::weight_gradient) {
            bd.add(w[t.chunk_b].bwd_weight.parts);
        } else {
            const Walks& f = w[t.chunk_f];
            const Walks& b = w[t.chunk_b];
            bd.add(f.fwd_deferred.parts);
            bd.add(b.bwd_deferred.parts);
            bd.ep_exposed_s += forward_backward_s(f, b, shape.comm_sm_fraction) -
                               (f.fwd_deferred.time_s + b.bwd_deferred.time_s);
        }
    }
    bd.dp_exposed_s = (critical.grads_synced_s - r.schedule.end_s[r.critical_stage]) +
                      critical.interference_s + time.param_gather_s;
    bd.optimizer_s = time.optimizer_s;
    bd.ep_jitter_s = time.synchronized_s * time.slowest.ep_jitter;
    bd.dp_jitter_s = time.synchronized_s * time.slowest.dp_jitter;
    bd.straggler_s = time.synchronized_s * time.slowest.stragglers;
    bd.pp_bubble_s = std::max(0.0, r.step_time_s - bd.total_s());
    return bd;
}

std::vector<MemoryBreakdown> stage_memory(const ModelConfig& model, const ClusterSpec& cluster,
                                          const parallel::Layout& layout, const SimOptions& o,
                                          const PipelineShape& shape,
                                          const ScheduleResult& schedule, const ChunkCosts& chunks,
                                          const ChunkGroups& groups) {
    // DualPipe's two copies of each stage share its optimizer state: sharded over 2 dp.
    parallel::Layout sharding = layout;
    if (shape.dualpipe) sharding.dp *= 2;
    std::vector<MemoryBreakdown> stages(shape.pp);
    for (int64_t s = 0; s < shape.pp; ++s) {
        const StageBlocks blocks = stage_blocks(shape, s, chunks, groups);
        MemoryBreakdown& mb = stages[s] =
            static_memory(blocks.params, sharding, o.precision, o.memory, cluster.gpu.hbm_bytes);
        mb.stage = s;
        const ActivationPeak a = activation_peak(shape, schedule.stages[s], chunks);
        const double peak =
            shape.dualpipe ? dualpipe_activation_peak_bytes(shape, s, chunks) : a.peak_bytes;
        mb.activations_bytes = peak + a.staging_bytes;
        mb.offloaded_bytes = a.offloaded_at_peak_bytes;
        add_comm_buffers(mb, model, layout, o, blocks);
    }
    return stages;
}

}  // namespace moetron::sim::step_phases
