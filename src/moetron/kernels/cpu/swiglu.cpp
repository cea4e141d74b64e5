// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"), the activation of DeepSeek-V3's
// dense MLPs and experts: out = silu(gate) * up, silu(g) = g * sigmoid(g).
//
// Backward, with s = sigmoid(g):  d silu(g)/dg = s * (1 + g * (1 - s)), so
//   dgate = dout * up * s * (1 + g * (1 - s)),   dup = dout * silu(g).
#include "moetron/kernels/cpu/swiglu.h"

#include <cmath>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/vector_exp.h"

namespace moetron::cpu {

namespace {

void check_dims(const char* op, int64_t num_rows, int64_t ffn_dim) {
    MT_CHECK(num_rows >= 0 && ffn_dim > 0, "[{}] need num_rows >= 0 and ffn_dim > 0, got M={} F={}",
             op, num_rows, ffn_dim);
}

}  // namespace

void swiglu_forward(float* out, const float* inp, int64_t num_rows, int64_t ffn_dim) {
    check_dims("swiglu_forward", num_rows, ffn_dim);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < num_rows; ++row) {
        const float* gate = inp + row * 2 * ffn_dim;
        const float* up = gate + ffn_dim;
        float* y = out + row * ffn_dim;
#pragma omp simd
        for (int64_t i = 0; i < ffn_dim; ++i)
            y[i] = gate[i] * sigmoid_vectorizable(gate[i]) * up[i];
    }
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t num_rows,
                     int64_t ffn_dim) {
    check_dims("swiglu_backward", num_rows, ffn_dim);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < num_rows; ++row) {
        const float* gate = inp + row * 2 * ffn_dim;
        const float* up = gate + ffn_dim;
        const float* dy = dout + row * ffn_dim;
        float* dgate = dinp + row * 2 * ffn_dim;
        float* dup = dgate + ffn_dim;
#pragma omp simd
        for (int64_t i = 0; i < ffn_dim; ++i) {
            const float g = gate[i];
            const float s =
                sigmoid_vectorizable(g);  // vector_exp.h: vectorizes, std::exp would not
            dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
            dup[i] = dy[i] * g * s;
        }
    }
}

}  // namespace moetron::cpu
