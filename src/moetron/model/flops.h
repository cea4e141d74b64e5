// Parameter and FLOP accounting: the one source of truth for cost (DESIGN.md sec. 4). The
// trainer reports with it and sim/ predicts with it. FLOPs follow Megatron-LM's
// num_floating_point_operations: 2 FLOPs per multiply-add, x3 for forward + backward, the causal
// attention core halved, the router GEMM not counted, MTP counted as one more MoE layer plus its
// projection and its logits.
#pragma once

#include <cstdint>

#include "moetron/model/config.h"

namespace moetron {

// Parameter counts (elements) per part of the model.
struct ParamCounts {
    double embedding = 0;    // V * D
    double output_head = 0;  // V * D (0 when tied)
    double final_norm = 0;   // D
    double attention = 0;    // all main-model layers: MLA projections and their norms
    double dense_mlp = 0;    // all dense layers' MLPs
    double moe_shared = 0;   // all MoE layers' shared experts
    double moe_routed = 0;   // all MoE layers' routed experts (every expert)
    double router = 0;       // all MoE layers' gates and correction biases
    double layer_norms = 0;  // the two RMSNorms per main-model layer
    double mtp = 0;          // all MTP modules' own parameters (not the shared head/embedding)
    double total = 0;        // main model (without MTP)
    double active = 0;       // per token: main model with K routed experts instead of E
    double routed_expert_single = 0;  // one routed expert's parameters (3 * D * F_moe)
};

// Forward+backward FLOPs per token at a sequence length, by part.
struct FlopsPerToken {
    double attention_linear = 0;  // MLA projections
    double attention_core = 0;    // QK^T and PV, causal (halved)
    double dense_mlp = 0;
    double moe_shared = 0;
    double moe_routed = 0;  // K active experts
    double logits = 0;      // output head
    double mtp = 0;         // MTP modules (0 when not counted)
    double total = 0;
};

// Parameters of one transformer block (main layer or the block inside an MTP module).
struct LayerParamCounts {
    double attention = 0;   // MLA: q (low-rank or plain), kv_a, kv_b, o, and the latent norms
    double norms = 0;       // input and post-attention RMSNorms
    double dense_mlp = 0;   // 3 * D * F (dense layers only)
    double moe_shared = 0;  // 3 * D * (n_shared * F_moe) (MoE layers only)
    double moe_routed = 0;  // E * 3 * D * F_moe: every routed expert (MoE layers only)
    double router = 0;      // gate E * D + correction bias E (MoE layers only)
    double total() const {
        return attention + norms + dense_mlp + moe_shared + moe_routed + router;
    }
};

// Forward+backward FLOPs per token of one transformer block (Megatron-LM convention as above).
struct LayerFlopsPerToken {
    double attention_linear = 0;
    double attention_core = 0;  // causal: half of the S x S score matrix
    double dense_mlp = 0;
    double moe_shared = 0;
    double moe_routed = 0;  // K active experts
    double total() const {
        return attention_linear + attention_core + dense_mlp + moe_shared + moe_routed;
    }
};

// Megatron-LM's factors: each GEMM runs 3 times (forward, data-grad, weight-grad), 2 FLOPs/MAC.
inline constexpr double kForwardBackwardFactor = 3.0;
inline constexpr double kFlopsPerMac = 2.0;

ParamCounts count_parameters(const ModelConfig& config);
LayerParamCounts count_layer_parameters(const ModelConfig& config, bool moe_layer);
// Parameters of one MTP module: eh_proj (2D -> D), its norms, and its block (shared embedding
// and output head excluded).
double count_mtp_module_parameters(const ModelConfig& config, int64_t depth);

FlopsPerToken flops_per_token(const ModelConfig& config, int64_t seq_len, bool include_mtp);
LayerFlopsPerToken layer_flops_per_token(const ModelConfig& config, int64_t seq_len,
                                         bool moe_layer);

}  // namespace moetron
