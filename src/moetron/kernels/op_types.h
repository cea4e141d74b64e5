// Parameter and result types shared by every backend's ops (kernels/backend.h): the same struct
// whichever backend runs the op, so callers never name a backend's namespace.
#pragma once

#include <algorithm>
#include <cstdint>

#include "moetron/core/precision.h"

namespace moetron {

// How one GEMM runs: the number format its operands are rounded to before the multiply (the
// products accumulate in float32 at least), chosen by the caller for the GEMM's role under the
// run's recipe (model/gemm_roles.h). Blocks run along each GEMM's reduction dimension (the
// recipes' row-wise copies for the forward and the input gradient, column-wise for the weight
// gradient); weights take 128 x 128 blocks under fp8-blockwise.
struct GemmPrecision {
    Precision format = Precision::fp32;
    // The input (the forward's activation operand) already holds format's row-wise quantized
    // values, as the expert dispatch delivers tokens in the recipe's format
    // (parallel/dispatch_payload.h): only the weight is quantized. Forward GEMMs only.
    bool input_quantized = false;
};
inline constexpr GemmPrecision kFp32Gemm{};

// The router's shape and DeepSeek-V3 config keys (kernels/cpu/router.h has the math).
struct RouterShape {
    int64_t num_tokens;   // N
    int64_t num_experts;  // E
    int64_t top_k;        // K (num_experts_per_tok)
    int64_t num_groups;   // G (n_group); E % G == 0; G == 1 is plain top-k
    int64_t topk_groups;  // topk_group <= G; K <= topk_group * E / G
    float routed_scaling_factor;
    bool norm_topk_prob;
};

// AdamW hyper-parameters of one update (kernels/cpu/adamw.h has the math).
struct AdamWParams {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;  // decoupled: p -= lr * weight_decay * p
    int64_t step;        // 1-based step count for bias correction
};

struct CrossEntropyResult {
    double loss_sum;    // sum of per-token losses over valid tokens
    int64_t num_valid;  // tokens whose target != ignore_index
    double mean() const { return num_valid ? loss_sum / static_cast<double>(num_valid) : 0.0; }
};

// How far one routing's tokens spread over the EP group: destination ranks and domains per token,
// summed and at most (kernels/cpu/dispatch_layout.h computes it).
struct RoutingSpread {
    int64_t num_tokens = 0;
    int64_t rank_sum = 0, rank_max = 0;
    int64_t domain_sum = 0, domain_max = 0;
};

// Where a dispatch hop's send slots live (kernels/cpu/dispatch_rows.h): slot s is row s of the
// send buffer, except the slots a rank sends to itself, [own_first_slot, + own_num_slots), which
// bypass the exchange and live in the receive buffer from row own_first_recv_row on.
struct SlotPlacement {
    int64_t own_first_slot = 0;
    int64_t own_num_slots = 0;
    int64_t own_first_recv_row = 0;
};

// The factor that clips a gradient of norm `norm` to max_norm (1 when it is already within, or
// when max_norm <= 0 disables clipping), as torch.nn.utils.clip_grad_norm_:
// clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1. A non-finite norm gives 0 or
// NaN, as torch with error_if_nonfinite=False; the trainer decides what to do then. Scalar host
// math, the same for every backend.
inline float clip_factor(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    const double factor = static_cast<double>(max_norm) / (norm + 1e-6);
    return static_cast<float>(std::min(factor, 1.0));  // std::min keeps a NaN factor (NaN first)
}

}  // namespace moetron
