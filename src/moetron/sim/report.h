// Reports of a simulated step: a text table for people, JSON for scripts.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "moetron/sim/step.h"

namespace moetron::sim {

std::string format_step_report(const StepResult& r);
nlohmann::json step_report_json(const StepResult& r);

// One line: the step with redundant experts beside the same step without them.
std::string format_redundant_comparison(const StepResult& with, const StepResult& without);

// One layer's forward and backward ops of one micro-batch: start, duration, kind.
std::string format_layer_ops(const StepResult& r);

// "tp1.pp2.vpp4.ep32.cp1 mbs1 1f1b recompute mlp,moe_act, graphs partial, dispatch two_tier,
// dispatch-payload recipe, moe-overlap dual, overlap dp-grad+dp-param" in one line.
std::string describe_options(const StepResult& r);

}  // namespace moetron::sim
