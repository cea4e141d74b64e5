// What to change when a configuration does not fit in GPU memory: each single change a
// published recipe uses to fit (more recompute, activation offloading, bf16 optimizer state,
// a smaller micro-batch, more pipeline or expert parallelism) is simulated, and the one that
// fits and keeps the most throughput is the cheapest.
#pragma once

#include <optional>
#include <string>

#include "moetron/model/config.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/layout.h"
#include "moetron/sim/step.h"

namespace moetron::sim {

struct FitChange {
    std::string change;  // in the command's words, e.g. "--recompute mla_up_proj,mlp,moe_act"
    double memory_bytes = 0;
    double capacity_bytes = 0;
    double tflops_per_gpu = 0;
};

// The cheapest single change that makes `layout` with `options` fit; none when no single change
// does (or when it already fits).
std::optional<FitChange> find_cheapest_fit(const ModelConfig& model, const ClusterSpec& cluster,
                                           const parallel::Layout& layout,
                                           const SimOptions& options);

// "The cheapest change that fits: ... (N of M GB, T TFLOPs/GPU)", or advice when none fits.
std::string describe_fit(const std::optional<FitChange>& fit);

}  // namespace moetron::sim
