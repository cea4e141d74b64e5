#include "moetron/cli/sim_options.h"

#include <CLI/CLI.hpp>

#include "moetron/cli/number_options.h"
#include "moetron/sim/memory.h"

namespace moetron::cli {

void add_memory_options(CLI::App& cmd, sim::MemoryFlags& memory) {
    cmd.add_option("--main-grads-dtype", memory.main_grads,
                   "main gradients: fp32 or bf16 (precision-aware optimizer)")
        ->capture_default_str();
    cmd.add_option("--main-params-dtype", memory.main_params,
                   "optimizer's main parameters: fp32 or fp16")
        ->capture_default_str();
    cmd.add_option("--exp-avg-dtype", memory.exp_avg, "Adam first moment: fp32, bf16, fp8")
        ->capture_default_str();
    cmd.add_option("--exp-avg-sq-dtype", memory.exp_avg_sq, "Adam second moment: fp32, bf16, fp8")
        ->capture_default_str();
    cmd.add_flag("--no-distributed-optimizer", memory.no_distributed_optimizer,
                 "keep the whole optimizer state on every data-parallel rank");
    cmd.add_flag("--bf16-primary-weights", memory.bf16_primary_weights,
                 "low precision: keep bf16 weights beside the quantized copies");
    cmd.add_flag("--low-precision-swiglu-input", memory.low_precision_swiglu_input,
                 "keep the MoE SwiGLU input for backward in the GEMM format (DeepSeek-V3)");
    cmd.add_option("--offload-activations", memory.offload,
                   "modules whose saved activations go to host memory (as --recompute names them)")
        ->capture_default_str();
}

void add_expert_imbalance_options(CLI::App& cmd, std::string& expert_imbalance,
                                  int64_t& redundant_experts) {
    cmd.add_option("--expert-imbalance", expert_imbalance,
                   "routed experts' load instead of balanced routing: zipf:S (expert i gets "
                   "1/(i+1)^S) or a `moetron train --log-jsonl` file (its last "
                   "average_expert_load); the busiest EP rank's expert compute and all-to-all "
                   "receive scale by tokens per rank max/mean");
    cmd.add_option("--redundant-experts", redundant_experts,
                   "spare expert slots over each expert-parallel group (R), placed on the "
                   "measured load as `moetron train --redundant-experts` places them: each rank "
                   "holds (experts + R) / ep slots; needs ep > 1 (default 0)")
        ->check(whole_number(0, int64_t{1} << 24));
}

}  // namespace moetron::cli
