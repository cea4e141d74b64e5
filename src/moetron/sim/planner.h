// Layout search: every (tp, pp, vpp, ep, cp, micro-batch, recompute) that divides the GPUs, the
// model and the global batch is simulated; layouts over the GPU memory are rejected; the rest
// are ranked by delivered TFLOPs/GPU. A cheap static-memory bound skips layouts whose weights,
// gradients and optimizer state alone overflow the GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/step.h"

namespace moetron::sim {

struct PlanSpace {
    std::vector<int64_t> tp = {1, 2, 4, 8};
    std::vector<int64_t> pp = {1, 2, 4, 8, 16};
    std::vector<int64_t> vpp = {1, 2, 4, 8};
    std::vector<int64_t> ep = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    std::vector<int64_t> cp = {1, 2};
    std::vector<int64_t> micro_batch = {1, 2};
    // The published recipes' settings (mla_up_proj on B200, mla_up_proj,mlp on H100,
    // mlp,moe_act on GB200/GB300) and heavier ones.
    std::vector<std::string> recompute = {"none",
                                          "mla_up_proj",
                                          "mlp,moe_act",
                                          "mla_up_proj,mlp",
                                          "mla_up_proj,mlp,moe_act",
                                          "layernorm,mla_up_proj,mlp,moe_act,shared_expert",
                                          "full"};
};

struct PlanCandidate {
    StepResult result;
    std::string recompute;
};

struct PlanResult {
    std::vector<PlanCandidate> ranked;  // fitting layouts, best first
    int64_t considered = 0;             // layouts that divide GPUs, model and batch
    int64_t rejected_memory = 0;        // of those, over the GPU memory
};

// Where a search stands, for a progress display: the layouts evaluated (simulated, or rejected by
// the static-memory bound) of all those that divide the GPUs, model and batch (the final
// PlanResult::considered), and the fitting layout with the most TFLOPs/GPU so far (nullptr before
// the first; valid during the call only).
struct PlanProgress {
    int64_t evaluated = 0;
    int64_t total = 0;
    const PlanCandidate* best = nullptr;
};
using PlanProgressCallback = std::function<void(const PlanProgress&)>;

// `base` supplies precision, sequence length, global batch and the software options (graphs,
// overlaps, dispatcher); micro-batch and recompute come from the space. `progress`, when given,
// is called after each layout evaluated (the result does not depend on it).
PlanResult plan_layouts(const ModelConfig& model, const ClusterSpec& cluster, int64_t gpus,
                        const SimOptions& base, const PlanSpace& space = PlanSpace{},
                        const PlanProgressCallback& progress = {});

// Why a candidate ranks where it does, in a few lines, relative to the best one.
std::string explain_candidate(const PlanCandidate& c, const PlanCandidate& best, int rank);

}  // namespace moetron::sim
