// Rotary position embedding (Su et al. 2021, RoFormer) in DeepSeek-V3's decoupled form: only the
// last `qk_rope_head_dim` (R = 64) dims of each query head, and the shared rope key, rotate.
//
// Layout follows Hugging Face transformers' DeepSeek-V3 `apply_rotary_pos_emb_interleave`:
//   x = x.view(..., R/2, 2).transpose(-1, -2).reshape(..., R)    # de-interleave the pairs
//   out = x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)     # rotate_half(a|b) = (-b|a)
// which for pair i (a = x[2i], b = x[2i+1]) at angle t = pos * inv_freq[i] reads
//   out[i] = a cos t - b sin t,   out[i + R/2] = b cos t + a sin t,
// with inv_freq[i] = theta^(-2i/R) (`rope_theta`).
//
// The backward is the transpose of that linear map: the inverse rotation followed by the
// re-interleave, da = dy[i] cos t + dy[i + R/2] sin t, db = -dy[i] sin t + dy[i + R/2] cos t.
#include "moetron/kernels/cpu/rope.h"

#include <cmath>

#include "moetron/core/error.h"

namespace moetron::cpu {

namespace {

// The slice is rewritten in a different order from the one it is read in, so a copy of it is
// kept on the stack; DeepSeek-V3 uses R = 64.
constexpr int64_t kMaxRopeDim = 1024;

void check_rope_args(const char* op, int64_t num_tokens, int64_t seq_len, int64_t num_heads,
                     int64_t head_stride, int64_t rope_offset, int64_t rope_dim) {
    MT_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= kMaxRopeDim,
             "[{}] rope_dim must be even and in (0, {}], got {}", op, kMaxRopeDim, rope_dim);
    MT_CHECK(num_tokens >= 0 && seq_len > 0 && num_heads > 0,
             "[{}] need num_tokens >= 0, seq_len > 0, num_heads > 0, got N={} S={} H={}", op,
             num_tokens, seq_len, num_heads);
    MT_CHECK(rope_offset >= 0 && rope_offset + rope_dim <= head_stride,
             "[{}] the rope slice [{}, {}) does not fit in a head of stride {}", op, rope_offset,
             rope_offset + rope_dim, head_stride);
}

}  // namespace

void rope_tables(float* cos, float* sin, int64_t seq_len, int64_t rope_dim, float theta) {
    MT_CHECK(seq_len >= 0 && rope_dim > 0 && rope_dim % 2 == 0,
             "[rope_tables] need seq_len >= 0 and an even rope_dim > 0, got S={} R={}", seq_len,
             rope_dim);
    MT_CHECK(theta > 1.0f, "[rope_tables] rope_theta must be > 1, got {}", theta);
    const int64_t half = rope_dim / 2;
    // In double: pos * inv_freq reaches ~S radians, where float would keep only ~4 digits of the
    // phase at S = 4096.
    for (int64_t pos = 0; pos < seq_len; ++pos) {
        for (int64_t i = 0; i < half; ++i) {
            const double inv_freq =
                1.0 / std::pow(static_cast<double>(theta), static_cast<double>(2 * i) / rope_dim);
            const double angle = static_cast<double>(pos) * inv_freq;
            cos[pos * half + i] = static_cast<float>(std::cos(angle));
            sin[pos * half + i] = static_cast<float>(std::sin(angle));
        }
    }
}

void rope_forward(float* x, const float* cos, const float* sin, int64_t num_tokens, int64_t seq_len,
                  int64_t num_heads, int64_t head_stride, int64_t rope_offset, int64_t rope_dim) {
    check_rope_args("rope_forward", num_tokens, seq_len, num_heads, head_stride, rope_offset,
                    rope_dim);
    const int64_t half = rope_dim / 2;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < num_tokens * num_heads; ++row) {
        const int64_t pos = (row / num_heads) % seq_len;
        const float* c = cos + pos * half;
        const float* s = sin + pos * half;
        float* slice = x + row * head_stride + rope_offset;
        float pairs[kMaxRopeDim];  // the interleaved input (a0, b0, a1, b1, ...)
        for (int64_t i = 0; i < rope_dim; ++i) pairs[i] = slice[i];
        for (int64_t i = 0; i < half; ++i) {
            const float a = pairs[2 * i], b = pairs[2 * i + 1];
            slice[i] = a * c[i] - b * s[i];
            slice[i + half] = b * c[i] + a * s[i];
        }
    }
}

void rope_backward(float* dx, const float* cos, const float* sin, int64_t num_tokens,
                   int64_t seq_len, int64_t num_heads, int64_t head_stride, int64_t rope_offset,
                   int64_t rope_dim) {
    check_rope_args("rope_backward", num_tokens, seq_len, num_heads, head_stride, rope_offset,
                    rope_dim);
    const int64_t half = rope_dim / 2;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < num_tokens * num_heads; ++row) {
        const int64_t pos = (row / num_heads) % seq_len;
        const float* c = cos + pos * half;
        const float* s = sin + pos * half;
        float* slice = dx + row * head_stride + rope_offset;
        float halves[kMaxRopeDim];  // the de-interleaved output gradient (dy_lo | dy_hi)
        for (int64_t i = 0; i < rope_dim; ++i) halves[i] = slice[i];
        for (int64_t i = 0; i < half; ++i) {
            const float dy_lo = halves[i], dy_hi = halves[i + half];
            slice[2 * i] = dy_lo * c[i] + dy_hi * s[i];
            slice[2 * i + 1] = dy_hi * c[i] - dy_lo * s[i];
        }
    }
}

}  // namespace moetron::cpu
