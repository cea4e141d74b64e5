// Causal softmax attention with separate query/key and value head dims (MLA: Dqk = 192, Dv = 128).
// Only the log-sum-exp of each score row is saved; the backward recomputes the probabilities,
// so memory is O(N H), not O(B H S^2).
#pragma once

#include <cstdint>

namespace moetron::cpu {

// q, k (B, S, H, Dqk); v (B, S, H, Dv); out (B, S, H, Dv); lse (B, H, S) saved.
// out[b,s,h] = sum_{j<=s} softmax_j(scale * q[b,s,h] . k[b,j,h]) v[b,j,h].
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                       int64_t v_head_dim, float scale);
// dq, dk, dv written.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                        int64_t v_head_dim, float scale);

}  // namespace moetron::cpu
