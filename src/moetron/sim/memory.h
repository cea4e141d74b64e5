// Memory per GPU: parameters, gradients, distributed-optimizer (ZeRO-1) state, activations of
// the micro-batches in flight, communication buffers and a framework reserve. Static parts come
// from the engine's own per-rank parameter count (model/params.h rank_param_count: TP shards,
// TP-replicated tensors whole, 1/ep of the routed experts); the
// optimizer state is sharded over DP (dense) and expert-DP (experts), as Megatron-LM's
// distributed optimizer does.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/model/config.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/layout.h"
#include "moetron/sim/ops.h"

namespace moetron::sim {

// Megatron-LM's precision-aware optimizer (--use-precision-aware-optimizer): bytes per element
// of the main gradients (--main-grads-dtype fp32|bf16), the main parameters the optimizer
// updates (--main-params-dtype fp32|fp16) and Adam's moments (--exp-avg-dtype,
// --exp-avg-sq-dtype fp32|bf16|fp8). The defaults are the published DeepSeek-V3 recipes':
// fp32 main gradients and parameters, bf16 moments (the DeepSeek-V3 report, sec. 3.3.3, keeps
// AdamW's moments in bf16; Megatron-LM's own default is fp32 everywhere).
struct OptimizerPrecision {
    double main_grad_bytes = 4;
    double main_param_bytes = 4;
    double exp_avg_bytes = 2;
    double exp_avg_sq_bytes = 2;
    double state_bytes() const { return main_param_bytes + exp_avg_bytes + exp_avg_sq_bytes; }
};

// "fp32" 4, "bf16"/"fp16" 2, "fp8" 1 (what the optimizer-dtype options accept); anything else
// is an error naming the option.
double optimizer_dtype_bytes(const std::string& name, const std::string& option);

struct MemoryOptions {
    OptimizerPrecision optimizer;
    // Distributed optimizer (ZeRO-1): main parameters and moments sharded over dp (dense) and
    // expert-dp (routed experts). Off: every rank holds the whole state of its parameters.
    bool distributed_optimizer = true;
    // Low-precision training keeps the primary weights only in the GEMM format (Megatron-LM's
    // --fp8-param-gather, TE's fp8_model_init: row- and column-wise quantized copies); off,
    // it keeps bf16 weights and caches the quantized copies beside them.
    bool low_precision_primary_weights = true;
    // Modules whose saved activations wait in host memory between forward and backward.
    Recompute offload;
    // The MoE SwiGLU input cached in the GEMM format (DeepSeek-V3's FP8 activation caching).
    bool low_precision_swiglu_input = false;
    double framework_reserve_bytes = 5e9;   // CUDA context, library workspaces, allocator slack
    double dp_bucket_bytes = 2 * 40e6 * 4;  // two in-flight 40M-element fp32 gradient buckets
};

// The memory options as `moetron simulate` and `moetron plan` spell them.
struct MemoryFlags {
    std::string main_grads = "fp32", main_params = "fp32", exp_avg = "bf16", exp_avg_sq = "bf16";
    std::string offload = "none";  // module list, as --recompute names them
    bool no_distributed_optimizer = false;
    bool bf16_primary_weights = false;
    bool low_precision_swiglu_input = false;
};
MemoryOptions memory_options_from_flags(const MemoryFlags& flags);

// Parameters one GPU holds for one block (rank_param_count of its model part): the dense part
// (TP shards and TP-replicated tensors) and this GPU's routed experts, (E + R) / ep expert slots
// with R redundant experts over the EP group (each slot a whole expert: weights, gradients and
// optimizer state).
struct BlockParams {
    double dense = 0;
    double expert = 0;
};
BlockParams block_params_per_gpu(const ModelConfig& model, BlockKind kind,
                                 const parallel::Layout& layout, int64_t redundant_experts = 0);
// (E + R) / E: the routed-expert parameters a rank holds with R redundant slots over those
// without (1 for a model without routed experts).
double expert_slot_factor(const ModelConfig& model, int64_t redundant_experts);

// Bytes per parameter of the stored weights under a recipe: the high-precision format
// (high_precision_bytes: bf16, fp32 under the fp32 recipe), or in low precision the row- and
// column-wise quantized copies (plus the bf16 weights unless they are the primary copy).
double weight_bytes_per_param(Precision recipe, bool low_precision_primary_weights = true);

struct MemoryBreakdown {
    int64_t stage = 0;
    double params = 0;  // parameters on this GPU (elements)
    double weights_bytes = 0;
    double grads_bytes = 0;
    double optimizer_bytes = 0;
    double activations_bytes = 0;   // peak of the micro-batches in flight
    double offloaded_bytes = 0;     // activations held in host memory at that peak (not counted)
    double comm_buffers_bytes = 0;  // EP dispatch buffers, TP gathers, DP buckets, logits
    double reserve_bytes = 0;
    double capacity_bytes = 0;
    double total_bytes() const {
        return weights_bytes + grads_bytes + optimizer_bytes + activations_bytes +
               comm_buffers_bytes + reserve_bytes;
    }
};

// Static memory of one stage from its parameters (dense and expert, per GPU).
MemoryBreakdown static_memory(const BlockParams& stage_params, const parallel::Layout& layout,
                              Precision recipe, const MemoryOptions& options,
                              double capacity_bytes);

// Throws "[sim] out of memory: ..." naming the stage, by how many GB it is over, and `remedy`
// (the cheapest change that makes it fit, when one was found).
void check_fits(const MemoryBreakdown& m, const std::string& what, const std::string& remedy);

}  // namespace moetron::sim
