// Plain SVG drawings written by hand (no plotting library): the step timeline of a simulated
// step and the weak-scaling chart of `moetron plan --scaling`.
#pragma once

#include <string>
#include <vector>

#include "moetron/sim/step.h"

namespace moetron::sim {

// One lane per pipeline stage with its forward, backward and combined tasks, the gradient
// sync / optimizer tail, and below them one MoE layer's forward and backward ops.
std::string step_timeline_svg(const StepResult& r);

struct ScalingPoint {
    int64_t gpus = 0;
    double tflops_per_gpu = 0;
    double efficiency = 0;  // per-GPU throughput relative to the first point
};
std::string scaling_svg(const std::vector<ScalingPoint>& points, const std::string& title);

void write_text_file(const std::string& path, const std::string& text);

}  // namespace moetron::sim
