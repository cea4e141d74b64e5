// MLA's per-head keys and values from its shared projections (DeepSeek-V3 eq. 4-5): kv_b_proj
// gives each head [k_nope | v], and the rope key (after RoPE) is one per token, shared by every
// head. Attention wants k and v per head, so the forward assembles them and the backward undoes
// the assembly.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// k (N, H, nope + R) written: [kv[t, h, :nope] | k_rope[t]]; v (N, H, Dv) written:
// kv[t, h, nope:]. kv (N, H, nope + Dv), k_rope (N, R).
void mla_kv_forward(float* k, float* v, const float* kv, const float* k_rope, int64_t num_tokens,
                    int64_t num_heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim);
// d_kv (N, H, nope + Dv) written: [dk[t, h, :nope] | dv[t, h]]; d_k_rope (N, R) written: the sum
// over heads of dk[t, h, nope:] (every head's copy of the shared key). dk (N, H, nope + R),
// dv (N, H, Dv).
void mla_kv_backward(float* d_kv, float* d_k_rope, const float* dk, const float* dv,
                     int64_t num_tokens, int64_t num_heads, int64_t nope_dim, int64_t rope_dim,
                     int64_t v_dim);

}  // namespace moetron::cpu
