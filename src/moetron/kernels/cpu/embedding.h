// Token embedding lookup and its scatter-add backward.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// out (N, D) = table[tokens] with table (V, D). Token ids must lie in [0, V).
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t num_tokens,
                       int64_t vocab_size, int64_t dim);
// dtable (V, D) += scatter of dout (N, D) by token id.
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t num_tokens,
                        int64_t vocab_size, int64_t dim);

// Vocabulary-parallel parts (Megatron-LM's VocabParallelEmbedding): table_part (Vp, D) holds rows
// [vocab_first, vocab_first + Vp) of the full table. Forward: out (N, D) written with the rows of
// the tokens in that range and zeros for the others (the sum over parts is the lookup). Backward:
// dtable_part += the scatter of dout by the tokens in the range. Token ids must lie in [0, V).
void embedding_part_forward(float* out, const int32_t* tokens, const float* table_part,
                            int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                            int64_t dim);
void embedding_part_backward(float* dtable_part, const float* dout, const int32_t* tokens,
                             int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                             int64_t dim);

}  // namespace moetron::cpu
