// Cross-entropy over the vocabulary with the softmax fused in: loss_t = lse_t - logits[t, y_t].
// Targets equal to ignore_index contribute nothing and are not counted.
#pragma once

#include <cstdint>

namespace moetron::cpu {

struct CrossEntropyResult {
    double loss_sum;    // sum of per-token losses over valid tokens
    int64_t num_valid;  // tokens whose target != ignore_index
    double mean() const { return num_valid ? loss_sum / static_cast<double>(num_valid) : 0.0; }
};

// losses (N) written (0 for ignored tokens); lse (N) saved. logits (N, V).
CrossEntropyResult cross_entropy_forward(float* losses, float* lse, const float* logits,
                                         const int32_t* targets, int64_t num_tokens,
                                         int64_t vocab_size, int32_t ignore_index);
// dlogits (N, V) written = (softmax(logits) - onehot(y)) * dloss_per_token for valid rows, 0 for
// ignored rows. For a mean over valid tokens, dloss_per_token = loss_weight / num_valid (the
// caller knows the global count across micro-batches and ranks). dlogits may alias logits.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, int64_t num_tokens, int64_t vocab_size,
                            int32_t ignore_index, float dloss_per_token);

}  // namespace moetron::cpu
