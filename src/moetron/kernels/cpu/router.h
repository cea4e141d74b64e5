// The DeepSeek-V3 router after its gate GEMM (logits = h Wg^T, done by the caller):
//   s = sigmoid(logits)                                     (scoring_func = "sigmoid")
//   choice = s + b          b: per-expert correction bias, used for selection only
//   group score = sum of the top-2 values of `choice` in each of the G groups (E/G experts each)
//   keep the topk_group groups with the largest group score (ties: lower index first)
//   pick the K experts with the largest `choice` inside the kept groups (ties: lower index)
//   w_j = s_j / sum_k s_k (when norm_topk_prob) * routed_scaling_factor
// The backward flows through the chosen s only: selection is piecewise constant.
#pragma once

#include <cstdint>

#include "moetron/kernels/op_types.h"

namespace moetron::cpu {

using moetron::RouterShape;

// topk_ids (N, K) in descending order of choice; topk_weights (N, K); scores (N, E) saved = s.
// bias (E) may be null (no correction). Experts outside the kept groups are never chosen (HF masks
// their choice to 0.0 instead; the two differ only when s + b < 0 inside a kept group). A group of
// one expert scores its single choice. E is at most 1024 (per-token scratch is on the stack).
void router_forward(int32_t* topk_ids, float* topk_weights, float* scores, const float* logits,
                    const float* bias, const RouterShape& shape);

// dlogits (N, E) written, from dtopk_weights (N, K) and, when non-null, an extra gradient on the
// scores dscores_extra (N, E) (the sequence-wise balance loss).
void router_backward(float* dlogits, const float* dtopk_weights, const float* dscores_extra,
                     const float* scores, const int32_t* topk_ids, const RouterShape& shape);

}  // namespace moetron::cpu
