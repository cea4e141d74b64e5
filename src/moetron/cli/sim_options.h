// The cluster model's software options that `moetron simulate` and `moetron plan` both take,
// registered once so that the two commands spell and explain them alike.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace moetron::sim {
struct MemoryFlags;
}  // namespace moetron::sim

namespace moetron::cli {

// --pp-schedule 1f1b|zb-h1|dualpipe.
void add_pipeline_schedule_option(CLI::App& cmd, std::string& schedule);

// The memory options: the precision-aware optimizer's dtypes, the distributed optimizer,
// primary weights, the low-precision SwiGLU cache and activation offloading.
void add_memory_options(CLI::App& cmd, sim::MemoryFlags& memory);

// --expert-imbalance zipf:S|FILE.jsonl (the routed experts' load; empty: balanced) and
// --redundant-experts R (spare expert slots over each EP group, as `moetron train` names it).
void add_expert_imbalance_options(CLI::App& cmd, std::string& expert_imbalance,
                                  int64_t& redundant_experts);

}  // namespace moetron::cli
