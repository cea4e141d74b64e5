// Memory per GPU: parameters, gradients, distributed-optimizer (ZeRO-1) state, activations of
// the micro-batches in flight, communication buffers and a framework reserve. Static parts come
// from model/flops' parameter counts split over TP (dense) and EP (routed experts); the
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

struct MemoryOptions {
    double grad_bytes_per_param = 4;        // fp32 main gradients
    double optimizer_bytes_per_param = 8;   // fp32 master weights + bf16 Adam moments
    double framework_reserve_bytes = 5e9;   // CUDA context, library workspaces, allocator slack
    double dp_bucket_bytes = 2 * 40e6 * 4;  // two in-flight 40M-element fp32 gradient buckets
};

// Parameters one GPU holds for one block: TP-split dense part and EP-split routed experts.
struct BlockParams {
    double dense = 0;
    double expert = 0;
};
BlockParams block_params_per_gpu(const ModelConfig& model, BlockKind kind,
                                 const ParallelLayout& layout);

// Bytes per parameter of the stored weights: bf16, or in low precision the row- and
// column-wise quantized copies (primary weights kept in the training format).
double weight_bytes_per_param(Precision p);

struct MemoryBreakdown {
    int64_t stage = 0;
    double params = 0;  // parameters on this GPU (elements)
    double weights_bytes = 0;
    double grads_bytes = 0;
    double optimizer_bytes = 0;
    double activations_bytes = 0;   // peak of the micro-batches in flight
    double comm_buffers_bytes = 0;  // EP dispatch buffers, TP gathers, DP buckets, logits
    double reserve_bytes = 0;
    double capacity_bytes = 0;
    double total_bytes() const {
        return weights_bytes + grads_bytes + optimizer_bytes + activations_bytes +
               comm_buffers_bytes + reserve_bytes;
    }
};

// Static memory of one stage from its parameters (dense and expert, per GPU).
MemoryBreakdown static_memory(const BlockParams& stage_params, const ParallelLayout& layout,
                              Precision precision, const MemoryOptions& options,
                              double capacity_bytes);

// Throws "[sim] out of memory: ..." naming the stage and by how many GB it is over.
void check_fits(const MemoryBreakdown& m, const std::string& what);

}  // namespace moetron::sim
