// MLA's key/value assembly: OpenMP over tokens.
#include "moetron/kernels/cpu/mla_kv.h"

namespace moetron::cpu {

void mla_kv_forward(float* k, float* v, const float* kv, const float* k_rope, int64_t num_tokens,
                    int64_t num_heads, int64_t nope_dim, int64_t rope_dim, int64_t v_dim) {
    const int64_t qk_dim = nope_dim + rope_dim, kv_dim = nope_dim + v_dim;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float* kr = k_rope + t * rope_dim;
        for (int64_t h = 0; h < num_heads; ++h) {
            const float* kv_head = kv + (t * num_heads + h) * kv_dim;
            float* k_head = k + (t * num_heads + h) * qk_dim;
            float* v_head = v + (t * num_heads + h) * v_dim;
            for (int64_t i = 0; i < nope_dim; ++i) k_head[i] = kv_head[i];
            for (int64_t i = 0; i < rope_dim; ++i) k_head[nope_dim + i] = kr[i];
            for (int64_t i = 0; i < v_dim; ++i) v_head[i] = kv_head[nope_dim + i];
        }
    }
}

void mla_kv_backward(float* d_kv, float* d_k_rope, const float* dk, const float* dv,
                     int64_t num_tokens, int64_t num_heads, int64_t nope_dim, int64_t rope_dim,
                     int64_t v_dim) {
    const int64_t qk_dim = nope_dim + rope_dim, kv_dim = nope_dim + v_dim;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        float* dkr = d_k_rope + t * rope_dim;
        for (int64_t i = 0; i < rope_dim; ++i) dkr[i] = 0.0f;
        for (int64_t h = 0; h < num_heads; ++h) {
            float* dkv_head = d_kv + (t * num_heads + h) * kv_dim;
            const float* dk_head = dk + (t * num_heads + h) * qk_dim;
            const float* dv_head = dv + (t * num_heads + h) * v_dim;
            for (int64_t i = 0; i < nope_dim; ++i) dkv_head[i] = dk_head[i];
            for (int64_t i = 0; i < v_dim; ++i) dkv_head[nope_dim + i] = dv_head[i];
            for (int64_t i = 0; i < rope_dim; ++i) dkr[i] += dk_head[nope_dim + i];
        }
    }
}

}  // namespace moetron::cpu
