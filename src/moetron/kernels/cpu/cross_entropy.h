// Cross-entropy over the vocabulary with the softmax fused in: loss_t = lse_t - logits[t, y_t].
// Targets equal to ignore_index contribute nothing and are not counted.
#pragma once

#include <cstdint>

#include "moetron/kernels/op_types.h"

namespace moetron::cpu {

using moetron::CrossEntropyResult;

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

// ---- Vocabulary-parallel parts (Megatron-LM's vocab_parallel_cross_entropy) ----
// logits (N, Vp) hold columns [vocab_first, vocab_first + Vp) of the full (N, V) logits; the
// caller combines the parts held by other ranks: the max over parts of row_max, then the sums
// over parts of sum_exp and target_logit, then lse_t = m_t + log(sum_exp_t) and
// loss_t = lse_t - target_logit_t. Targets are checked by the caller (ids in [0, V) or
// ignore_index); those outside this part count as 0 here.

// row_max (N) written: the max of each row of this part.
void cross_entropy_part_max(float* row_max, const float* logits, int64_t num_tokens,
                            int64_t part_vocab);
// sum_exp (N) = sum over this part of exp(logits[t, v] - row_max[t]) (row_max: over all parts);
// target_logit (N) = logits[t, y_t - vocab_first] when this part holds y_t, else 0. Doubles, so
// that the sums over parts lose nothing.
void cross_entropy_part_sums(double* sum_exp, double* target_logit, const float* logits,
                             const float* row_max, const int32_t* targets, int64_t num_tokens,
                             int64_t part_vocab, int64_t vocab_first, int32_t ignore_index);
// dlogits (N, Vp) written: columns [vocab_first, vocab_first + Vp) of cross_entropy_backward's
// result, from the full rows' lse. dlogits may alias logits.
void cross_entropy_part_backward(float* dlogits, const float* logits, const float* lse,
                                 const int32_t* targets, int64_t num_tokens, int64_t part_vocab,
                                 int64_t vocab_first, int32_t ignore_index, float dloss_per_token);

}  // namespace moetron::cpu
