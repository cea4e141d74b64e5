// Row moves: OpenMP over rows for the float blocks; the token shifts are a few KB, serial.
#include "moetron/kernels/cpu/row_copy.h"

#include <cstring>

namespace moetron::cpu {

void copy_rows_strided(float* dst, const float* src, int64_t num_rows, int64_t width,
                       int64_t dst_stride, int64_t src_stride) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < num_rows; ++r)
        std::memcpy(dst + r * dst_stride, src + r * src_stride, width * sizeof(float));
}

void shift_sequences(int32_t* out, const int32_t* inp, int64_t batch, int64_t seq_len,
                     int64_t shift, int32_t fill) {
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t t = 0; t < seq_len; ++t) {
            const int64_t i = b * seq_len + t;
            out[i] = t + shift < seq_len ? inp[i + shift] : fill;
        }
    }
}

}  // namespace moetron::cpu
