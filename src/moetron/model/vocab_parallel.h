// Vocabulary-parallel embedding and cross-entropy over the tensor-parallel group (Megatron-LM,
// Shoeybi et al. 2019 sec. 3): the (V, D) embedding table and the output head are split by
// vocabulary rows, TP rank r holding rows [r*V/tp, (r+1)*V/tp) (the kernels' *_part functions).
//   embedding: each rank looks up the N tokens in its table rows (zeros for the others) and a
//     reduce-scatter sums the parts into the rank's N/tp token rows of the stream (sequence
//     parallelism, block.h). Backward: the stream's gradient rows are all-gathered and each rank
//     scatters them into its table rows.
//   output head: a column-parallel GEMM gives each rank its (N, V/tp) logits; the caller sums the
//     head's partial input gradients over TP (f).
//   cross-entropy: the row maxima of every rank are all-gathered (the Communicator reduces by sum
//     only) and maxed; one all-reduce then sums [sum of exp | target logit] (2N doubles), the
//     target logit coming from the rank that holds the target. The backward is local:
//     (softmax - onehot) on the rank's columns, from the full rows' lse.
// With one rank each function is the plain kernel.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/kernels/backend.h"
#include "moetron/model/params.h"
#include "moetron/parallel/tensor_parallel.h"

namespace moetron {

struct VocabParallelScratch {
    float* row_max = nullptr;   // (N) this rank's row maxima, then the global ones
    float* part_max = nullptr;  // (tp, N) every rank's row maxima
    double* sums = nullptr;     // (2, N) [sum of exp | target logit], summed over TP
};

// Binds nothing when tp_size == 1 (the plain kernels need no scratch).
void bind_vocab_parallel_scratch(BufferBinder& b, VocabParallelScratch& s,
                                 const std::string& prefix, int tp_size, int64_t num_tokens);

// out (N/tp, D) written: this rank's token rows of the lookup of tokens (N) in the table, of
// which this rank holds its part (V/tp, D). full: (N, D) scratch (tp > 1).
void vocab_parallel_embedding_forward(Backend& ops, float* out, const int32_t* tokens,
                                      const float* table_part, float* full, int64_t num_tokens,
                                      int64_t vocab_size, int64_t dim,
                                      const parallel::TensorParallel& tp);
// dtable_part (V/tp, D) += the scatter of the whole dout (every rank's (N/tp, D) rows) by the
// tokens this rank's part holds. full: (N, D) scratch (tp > 1).
void vocab_parallel_embedding_backward(Backend& ops, float* dtable_part, const float* dout,
                                       const int32_t* tokens, float* full, int64_t num_tokens,
                                       int64_t vocab_size, int64_t dim,
                                       const parallel::TensorParallel& tp);

// losses (N) and lse (N) of the full rows written (the same on every TP rank) from this rank's
// logits part (N, V/tp); as the cross_entropy_forward op.
CrossEntropyResult vocab_parallel_cross_entropy_forward(
    Backend& ops, float* losses, float* lse, const float* logits_part, const int32_t* targets,
    const VocabParallelScratch& scratch, int64_t num_tokens, int64_t vocab_size,
    int32_t ignore_index, const parallel::TensorParallel& tp);
// dlogits_part (N, V/tp) written; may alias logits_part. As the cross_entropy_backward op.
void vocab_parallel_cross_entropy_backward(Backend& ops, float* dlogits_part,
                                           const float* logits_part, const float* lse,
                                           const int32_t* targets, int64_t num_tokens,
                                           int64_t vocab_size, int32_t ignore_index,
                                           float dloss_per_token,
                                           const parallel::TensorParallel& tp);

}  // namespace moetron
