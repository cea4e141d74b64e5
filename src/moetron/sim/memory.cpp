#include "moetron/sim/memory.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/model/params.h"

namespace moetron::sim {

BlockParams block_params_per_gpu(const ModelConfig& m, BlockKind kind, const parallel::Layout& l,
                                 int64_t redundant_experts) {
    // The same count as the engine's memory plan (plan_rank_memory): what a rank of this tp x ep
    // layout allocates for the block.
    const ModelPart part = [kind] {
        switch (kind) {
            case BlockKind::dense_layer:
                return ModelPart::dense_layer;
            case BlockKind::moe_layer:
                return ModelPart::moe_layer;
            case BlockKind::embedding:
                return ModelPart::embedding;
            case BlockKind::output_head:
                return ModelPart::output;
            case BlockKind::mtp_extra:
                return ModelPart::mtp_extra;
        }
        MT_THROW("[sim] unknown block kind {}", static_cast<int>(kind));
    }();
    const RankParamCount n = rank_param_count(m, part, l.tp, l.ep);
    BlockParams p{static_cast<double>(n.dense), static_cast<double>(n.expert)};
    if (redundant_experts > 0) p.expert *= expert_slot_factor(m, redundant_experts);
    return p;
}

double expert_slot_factor(const ModelConfig& m, int64_t redundant_experts) {
    // E / ep experts per rank become (E + R) / ep slots of the same size.
    if (m.n_routed_experts <= 0) return 1.0;
    return static_cast<double>(m.n_routed_experts + redundant_experts) /
           static_cast<double>(m.n_routed_experts);
}

double optimizer_dtype_bytes(const std::string& name, const std::string& option) {
    if (name == "fp32") return 4;
    if (name == "bf16" || name == "fp16") return 2;
    if (name == "fp8") return 1;
    MT_USER_THROW("{} must be fp32, bf16, fp16 or fp8, got '{}'", option, name);
}

MemoryOptions memory_options_from_flags(const MemoryFlags& f) {
    MemoryOptions o;
    o.optimizer.main_grad_bytes = optimizer_dtype_bytes(f.main_grads, "--main-grads-dtype");
    o.optimizer.main_param_bytes = optimizer_dtype_bytes(f.main_params, "--main-params-dtype");
    o.optimizer.exp_avg_bytes = optimizer_dtype_bytes(f.exp_avg, "--exp-avg-dtype");
    o.optimizer.exp_avg_sq_bytes = optimizer_dtype_bytes(f.exp_avg_sq, "--exp-avg-sq-dtype");
    if (o.optimizer.main_grad_bytes < 2 || o.optimizer.main_param_bytes < 2) {
        MT_USER_THROW("--main-grads-dtype and --main-params-dtype must be fp32, bf16 or fp16");
    }
    o.offload = parse_recompute(f.offload);
    if (o.offload.full) {
        MT_USER_THROW("--offload-activations takes modules (such as moe,mlp), not 'full'");
    }
    o.distributed_optimizer = !f.no_distributed_optimizer;
    o.low_precision_primary_weights = !f.bf16_primary_weights;
    o.low_precision_swiglu_input = f.low_precision_swiglu_input;
    return o;
}

double weight_bytes_per_param(Precision recipe, bool low_precision_primary_weights) {
    if (!is_low_precision(recipe)) return high_precision_bytes(recipe);
    return 2 * operand_bytes(math_rate_of(recipe)) + (low_precision_primary_weights ? 0.0 : 2.0);
}

MemoryBreakdown static_memory(const BlockParams& sp, const parallel::Layout& l, Precision recipe,
                              const MemoryOptions& o, double capacity_bytes) {
    MemoryBreakdown mb;
    const double params = sp.dense + sp.expert;
    mb.params = params;
    mb.weights_bytes = params * weight_bytes_per_param(recipe, o.low_precision_primary_weights);
    mb.grads_bytes = params * o.optimizer.main_grad_bytes;
    const double dense_shards = o.distributed_optimizer ? static_cast<double>(l.dp) : 1.0;
    const double expert_shards =
        o.distributed_optimizer ? static_cast<double>(std::max<int64_t>(1, l.edp())) : 1.0;
    mb.optimizer_bytes =
        o.optimizer.state_bytes() * (sp.dense / dense_shards + sp.expert / expert_shards);
    mb.reserve_bytes = o.framework_reserve_bytes;
    mb.comm_buffers_bytes = o.dp_bucket_bytes;
    mb.capacity_bytes = capacity_bytes;
    return mb;
}

void check_fits(const MemoryBreakdown& m, const std::string& what, const std::string& remedy) {
    const double total = m.total_bytes();
    if (total <= m.capacity_bytes) return;
    // A layout that does not fit is the user's choice, not an internal error: no source location.
    MT_USER_THROW(
        "[sim] out of memory: {} needs {:.1f} GB per GPU on pipeline stage {} but the GPU has "
        "{:.1f} GB ({:.1f} GB over): weights {:.1f}, gradients {:.1f}, optimizer {:.1f}, "
        "activations {:.1f}, buffers {:.1f}, reserve {:.1f} GB. {}",
        what, total / 1e9, m.stage, m.capacity_bytes / 1e9, (total - m.capacity_bytes) / 1e9,
        m.weights_bytes / 1e9, m.grads_bytes / 1e9, m.optimizer_bytes / 1e9,
        m.activations_bytes / 1e9, m.comm_buffers_bytes / 1e9, m.reserve_bytes / 1e9,
        remedy.empty() ? "Try more pp or ep, recompute, or a smaller micro-batch" : remedy);
}

}  // namespace moetron::sim
