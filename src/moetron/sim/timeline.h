// One GPU stream running a list of ops (a model chunk's forward or backward for one
// micro-batch), with the host racing to launch them: an op starts when the GPU is free and the
// host has issued it; a device-to-host sync makes the host wait for the GPU; CUDA graphs replace
// per-kernel host costs with one launch per captured segment. Communication ops are exposed, or
// hidden behind the neighbouring GEMM (TP) / attention (CP) when overlap is on; EP all-to-all
// can be kept off the stream for the combined forward-backward rule (step_phases.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/sim/hardware.h"
#include "moetron/sim/ops.h"

namespace moetron::sim {

enum class CudaGraphs : uint8_t {
    none,     // every kernel launched eagerly
    partial,  // static parts captured (attention, router, preprocess, shared expert, dense MLP)
    full,     // everything captured; MoE token counts stay on the GPU (no host sync)
};
CudaGraphs cuda_graphs_from_name(const std::string& name);
std::string_view cuda_graphs_name(CudaGraphs g);

struct TimeBreakdown {
    double gemm_s = 0;
    double attention_s = 0;
    double memory_bound_s = 0;  // norms, activations, quantization, permutes
    double recompute_s = 0;     // forward ops rerun in backward (all kinds)
    double host_idle_s = 0;     // GPU waiting for the host to launch kernels
    double tp_exposed_s = 0;
    double ep_exposed_s = 0;
    double cp_exposed_s = 0;
    // Activation offloading's copies to and from host memory beyond the compute they run beside.
    double offload_exposed_s = 0;
    double pp_bubble_s = 0;   // idle in the pipeline schedule (incl. waiting for p2p)
    double dp_exposed_s = 0;  // gradient reduce-scatter and parameter all-gather not hidden
    double optimizer_s = 0;
    // Waiting at synchronizing collectives for the slowest GPU (speed spread, stragglers).
    double ep_jitter_s = 0, dp_jitter_s = 0, straggler_s = 0;
    double compute_s() const { return gemm_s + attention_s + memory_bound_s + recompute_s; }
    double total_s() const;
    void add(const TimeBreakdown& o, double scale = 1);
};

// One op on a timeline (a layer's forward or backward), for the SVG.
struct OpEvent {
    std::string name;
    OpKind kind;
    double start_s = 0, end_s = 0;
    bool recompute = false;
};

struct WalkOptions {
    CudaGraphs cuda_graphs = CudaGraphs::none;
    bool overlap_tp = false;
};

struct WalkResult {
    double time_s = 0;
    TimeBreakdown parts;
    double ep_comm_s = 0;  // EP comm time left off the stream (deferred for merging)
    std::vector<OpEvent> events;
};

struct OpList {
    std::vector<const Op*> ops;
    std::vector<bool> block_start;
    // The whole list, as an unsplit backward (or a forward) runs it.
    void append(const std::vector<Op>& list) {
        bool first = true;
        for (const Op& op : list) {
            if (op.split_backward_stash) continue;
            ops.push_back(&op);
            block_start.push_back(first);
            first = false;
        }
    }
    // Only the weight-gradient ops (the W pass) or only the others with the stash copies that
    // a split backward adds (B).
    void append_part(const std::vector<Op>& list, bool weight_gradients) {
        bool first = true;
        for (const Op& op : list) {
            if (op.weight_gradient != weight_gradients) continue;
            ops.push_back(&op);
            block_start.push_back(first);
            first = false;
        }
    }
};

WalkResult walk_ops(const ClusterSpec& c, const OpList& list, const WalkOptions& o, bool defer_ep,
                    bool record);

}  // namespace moetron::sim
