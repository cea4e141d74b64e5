// The cluster model's software options that `moetron simulate` and `moetron plan` both take,
// registered once so that the two commands spell and explain them alike (those the engine's
// commands take too are vocabulary.h's).
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

// The help of the options simulate and plan share with the engine's commands (vocabulary.h).
inline constexpr const char* kSimPrecisionHelp =
    "the training recipe, whose GEMMs run at its tensor-core rate: bf16, fp32 (a CPU measured by "
    "moetron calibrate), mxfp8, fp8-blockwise (DeepSeek-V3's FP8, at the fp8 rate) or nvfp4 (at "
    "the fp4 rate; priced here only, the engine has no NVFP4 recipe yet)";
inline constexpr const char* kSimDispatchPayloadHelp =
    "what the tokens sent to the routed experts travel as: activation (default: bf16, fp32 under "
    "--precision fp32, quantized at the experts' GEMM, as Megatron-LM sends them) or recipe (the "
    "--precision's GEMM format with its scales, quantized before the send, as DeepSeek-V3 "
    "dispatches FP8)";
inline constexpr const char* kSimMoeOverlapHelp =
    "how the MoE all-to-all hides: off, or dual (priced as Megatron-LM's combined 1F1B: the "
    "forward of one micro-batch and the backward of another run as one task, each one's EP "
    "all-to-all behind the other's compute; with pp > 1 it needs vpp > 1 or dualpipe); shared, "
    "train's overlap of the dispatch with the shared experts alone, is not modelled";
inline constexpr const char* kSimPpScheduleHelp =
    "pipeline schedule: 1f1b (interleaved with vpp > 1), zb-h1 (zero bubble), dualpipe";

// The memory options: the precision-aware optimizer's dtypes, the distributed optimizer,
// primary weights, the low-precision SwiGLU cache and activation offloading.
void add_memory_options(CLI::App& cmd, sim::MemoryFlags& memory);

// --expert-imbalance zipf:S|FILE.jsonl (the routed experts' load; empty: balanced) and
// --redundant-experts R (spare expert slots over each EP group, as `moetron train` names it).
void add_expert_imbalance_options(CLI::App& cmd, std::string& expert_imbalance,
                                  int64_t& redundant_experts);

}  // namespace moetron::cli
