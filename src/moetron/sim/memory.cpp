#include "moetron/sim/memory.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/model/flops.h"

namespace moetron::sim {

BlockParams block_params_per_gpu(const ModelConfig& m, BlockKind kind, const ParallelLayout& l) {
    const double tp = static_cast<double>(l.tp), ep = static_cast<double>(l.ep);
    const double d = static_cast<double>(m.hidden_size), v = static_cast<double>(m.vocab_size);
    BlockParams b;
    switch (kind) {
        case BlockKind::dense_layer:
            b.dense = count_layer_parameters(m, false).total() / tp;
            break;
        case BlockKind::moe_layer: {
            const LayerParamCounts p = count_layer_parameters(m, true);
            b.dense = (p.total() - p.moe_routed) / tp;
            b.expert = p.moe_routed / ep;
            break;
        }
        case BlockKind::embedding:
            b.dense = v * d / tp;
            break;
        case BlockKind::output_head:
            b.dense = ((m.tie_word_embeddings ? 0 : v * d) + d) / tp;
            break;
        case BlockKind::mtp_extra:
            // An MTP module's own parameters beyond its block: the 2D -> D projection and norms.
            b.dense = (count_mtp_module_parameters(m, 0) -
                       count_layer_parameters(m, m.mtp_layer_is_moe(0)).total()) /
                      tp;
            break;
    }
    return b;
}

double weight_bytes_per_param(Precision p) {
    return is_low_precision(p) ? 2 * precision_bytes(p) : 2.0;
}

MemoryBreakdown static_memory(const BlockParams& sp, const ParallelLayout& l, Precision precision,
                              const MemoryOptions& o, double capacity_bytes) {
    MemoryBreakdown mb;
    const double params = sp.dense + sp.expert;
    mb.params = params;
    mb.weights_bytes = params * weight_bytes_per_param(precision);
    mb.grads_bytes = params * o.grad_bytes_per_param;
    mb.optimizer_bytes = o.optimizer_bytes_per_param *
                         (sp.dense / static_cast<double>(l.dp) +
                          sp.expert / static_cast<double>(std::max<int64_t>(1, l.edp())));
    mb.reserve_bytes = o.framework_reserve_bytes;
    mb.comm_buffers_bytes = o.dp_bucket_bytes;
    mb.capacity_bytes = capacity_bytes;
    return mb;
}

void check_fits(const MemoryBreakdown& m, const std::string& what) {
    const double total = m.total_bytes();
    if (total <= m.capacity_bytes) return;
    MT_THROW(
        "[sim] out of memory: {} needs {:.1f} GB per GPU on pipeline stage {} but the GPU has "
        "{:.1f} GB ({:.1f} GB over): weights {:.1f}, gradients {:.1f}, optimizer {:.1f}, "
        "activations {:.1f}, buffers {:.1f}, reserve {:.1f} GB. Try more pp or ep, recompute, or "
        "a smaller micro-batch",
        what, total / 1e9, m.stage, m.capacity_bytes / 1e9, (total - m.capacity_bytes) / 1e9,
        m.weights_bytes / 1e9, m.grads_bytes / 1e9, m.optimizer_bytes / 1e9,
        m.activations_bytes / 1e9, m.comm_buffers_bytes / 1e9, m.reserve_bytes / 1e9);
}

}  // namespace moetron::sim
