// Rotary position embedding on a slice of each head (DeepSeek-V3's decoupled RoPE), in the
// layout of the Hugging Face DeepSeek-V3 implementation (rope_interleave): the R-dim slice is
// read as interleaved pairs (x[2i], x[2i+1]), rotated by angle pos * theta^(-2i/R), and written
// back de-interleaved: out[i] = x[2i] cos - x[2i+1] sin, out[i + R/2] = x[2i+1] cos + x[2i] sin.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// cos, sin (S, R/2): the angle table for positions 0..S-1.
void rope_tables(float* cos, float* sin, int64_t seq_len, int64_t rope_dim, float theta);

// In place on x, rows of N tokens x num_heads heads; head h of token t starts at
// x + (t * num_heads + h) * head_stride and its rope slice at + rope_offset. The position of
// token t is t % seq_len.
void rope_forward(float* x, const float* cos, const float* sin, int64_t num_tokens, int64_t seq_len,
                  int64_t num_heads, int64_t head_stride, int64_t rope_offset, int64_t rope_dim);
// The inverse rotation applied in place to the gradient (the transpose of the forward map).
void rope_backward(float* dx, const float* cos, const float* sin, int64_t num_tokens,
                   int64_t seq_len, int64_t num_heads, int64_t head_stride, int64_t rope_offset,
                   int64_t rope_dim);

}  // namespace moetron::cpu
