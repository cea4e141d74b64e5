// Token permutation for the experts. Each token t has K copies c = t*K + j, one per chosen expert
// topk_ids[t, j]. The layout sorts the copies by expert, stably (copy order within an expert),
// giving copy_to_row (where copy c sits in the permuted buffer) and expert_offsets (E + 1
// segment boundaries for grouped_linear). permute and unpermute are each other's backward:
//   permute:   out[copy_to_row[c]] = inp[c / K]
//   unpermute: out[t] = sum_j weights[t, j] * inp[copy_to_row[t*K + j]]
#pragma once

#include <cstdint>

namespace moetron::cpu {

// copy_to_row (N*K); expert_offsets (E + 1). Expert ids must lie in [0, E).
void moe_permute_layout(int32_t* copy_to_row, int64_t* expert_offsets, const int32_t* topk_ids,
                        int64_t num_tokens, int64_t top_k, int64_t num_experts);

// out (N*K, D) from inp (N, D).
void permute_forward(float* out, const float* inp, const int32_t* copy_to_row, int64_t num_tokens,
                     int64_t top_k, int64_t dim);
// dinp (N, D) written: the sum of the gradients of the token's K copies.
void permute_backward(float* dinp, const float* dout, const int32_t* copy_to_row,
                      int64_t num_tokens, int64_t top_k, int64_t dim);

// out (N, D) written from inp (N*K, D) and weights (N, K).
void unpermute_forward(float* out, const float* inp, const float* weights,
                       const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k, int64_t dim);
// dinp (N*K, D) and dweights (N, K) written.
void unpermute_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                        const float* weights, const int32_t* copy_to_row, int64_t num_tokens,
                        int64_t top_k, int64_t dim);

}  // namespace moetron::cpu
