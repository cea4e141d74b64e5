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

}  // namespace moetron::cpu
