// Row moves between token-major buffers that are not a plain copy: a block of columns between
// buffers of different widths (MTP's concatenation [emb | h]), and sequences shifted by a few
// positions (MTP's inputs and targets, DeepSeek-V3 sec. 2.2).
#pragma once

#include <cstdint>

namespace moetron::cpu {

// dst[r * dst_stride + i] = src[r * src_stride + i] for r < num_rows, i < width (in floats; both
// strides >= width).
void copy_rows_strided(float* dst, const float* src, int64_t num_rows, int64_t width,
                       int64_t dst_stride, int64_t src_stride);
// out (B, S) written: out[b, t] = inp[b, t + shift] while t + shift < S, else fill. Each sequence
// moves shift >= 0 positions towards its start, and the positions past its end take fill.
void shift_sequences(int32_t* out, const int32_t* inp, int64_t batch, int64_t seq_len,
                     int64_t shift, int32_t fill);

}  // namespace moetron::cpu
