#include "moetron/sim/timeline.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/sim/costs.h"

namespace moetron::sim {

CudaGraphs cuda_graphs_from_name(const std::string& name) {
    if (name == "none") return CudaGraphs::none;
    if (name == "partial") return CudaGraphs::partial;
    if (name == "full") return CudaGraphs::full;
    MT_THROW("[sim] unknown CUDA graph mode '{}' (known: none, partial, full)", name);
}

std::string_view cuda_graphs_name(CudaGraphs g) {
    switch (g) {
        case CudaGraphs::none:
            return "none";
        case CudaGraphs::partial:
            return "partial";
        case CudaGraphs::full:
            return "full";
    }
    return "none";
}

double TimeBreakdown::total_s() const {
    return compute_s() + host_idle_s + tp_exposed_s + ep_exposed_s + cp_exposed_s +
           offload_exposed_s + pp_bubble_s + dp_exposed_s + optimizer_s + ep_jitter_s +
           dp_jitter_s + straggler_s;
}

void TimeBreakdown::add(const TimeBreakdown& o, double s) {
    gemm_s += s * o.gemm_s;
    attention_s += s * o.attention_s;
    memory_bound_s += s * o.memory_bound_s;
    recompute_s += s * o.recompute_s;
    host_idle_s += s * o.host_idle_s;
    tp_exposed_s += s * o.tp_exposed_s;
    ep_exposed_s += s * o.ep_exposed_s;
    cp_exposed_s += s * o.cp_exposed_s;
    offload_exposed_s += s * o.offload_exposed_s;
    pp_bubble_s += s * o.pp_bubble_s;
    dp_exposed_s += s * o.dp_exposed_s;
    optimizer_s += s * o.optimizer_s;
    ep_jitter_s += s * o.ep_jitter_s;
    dp_jitter_s += s * o.dp_jitter_s;
    straggler_s += s * o.straggler_s;
}

namespace {

bool is_graphed(const Op& op, CudaGraphs g) {
    return g == CudaGraphs::full || (g == CudaGraphs::partial && op.graphable);
}

}  // namespace

// Runs ops on one GPU stream with the host issuing them: an op starts when the GPU is free and
// the host has launched it; a sync makes the host wait for the GPU. defer_ep keeps EP comm off
// the stream (its time is returned for the combined forward-backward rule).
WalkResult walk_ops(const ClusterSpec& c, const OpList& list, const WalkOptions& o, bool defer_ep,
                    bool record) {
    WalkResult w;
    const auto& ops = list.ops;
    std::vector<double> gpu_s(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) gpu_s[i] = op_gpu_time_s(c, *ops[i]);
    const double f = c.efficiency.comm_sm_fraction;
    double host = 0, gpu = 0;
    bool in_graph = false;
    for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = *ops[i];
        if (op.kind == OpKind::sync) {
            host = std::max(host, gpu);
            in_graph = false;
            continue;
        }
        if (is_graphed(op, o.cuda_graphs)) {
            if (!in_graph || list.block_start[i]) host += c.efficiency.graph_launch_s;
            in_graph = true;
        } else {
            host += op_host_time_s(c, op);
            in_graph = false;
        }
        const double start = std::max(gpu, host);
        w.parts.host_idle_s += start - gpu;
        double dur = gpu_s[i];
        switch (op.kind) {
            case OpKind::gemm:
            case OpKind::grouped_gemm:
                (op.is_recompute ? w.parts.recompute_s : w.parts.gemm_s) += dur;
                break;
            case OpKind::attention:
                (op.is_recompute ? w.parts.recompute_s : w.parts.attention_s) += dur;
                break;
            case OpKind::memory:
            case OpKind::copy:
                (op.is_recompute ? w.parts.recompute_s : w.parts.memory_bound_s) += dur;
                break;
            case OpKind::comm_ep:
                if (defer_ep) {
                    w.ep_comm_s += dur;
                    dur = 0;
                } else {
                    w.parts.ep_exposed_s += dur;
                }
                break;
            case OpKind::comm_tp:
            case OpKind::comm_cp: {
                const bool overlap = op.kind == OpKind::comm_tp ? o.overlap_tp : true;
                if (overlap && op.overlappable) {
                    // Hidden behind the neighbouring GEMM (TP) or attention (CP); the compute
                    // loses the SMs the comm kernel takes while they overlap.
                    const OpKind want =
                        op.kind == OpKind::comm_tp ? OpKind::gemm : OpKind::attention;
                    double neighbour = 0;
                    if (i > 0 && ops[i - 1]->kind == want) neighbour = gpu_s[i - 1];
                    if (i + 1 < ops.size() && ops[i + 1]->kind == want) {
                        neighbour = std::max(neighbour, gpu_s[i + 1]);
                    }
                    dur = std::max(f * dur, dur - neighbour);
                }
                (op.kind == OpKind::comm_tp ? w.parts.tp_exposed_s : w.parts.cp_exposed_s) += dur;
                break;
            }
            case OpKind::sync:
                break;
        }
        if (record) w.events.push_back({op.name, op.kind, start, start + dur, op.is_recompute});
        gpu = start + dur;
    }
    w.time_s = gpu;
    return w;
}

}  // namespace moetron::sim
