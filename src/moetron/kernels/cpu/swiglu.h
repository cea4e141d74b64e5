// SwiGLU (Shazeer 2020): out = silu(gate) * up. gate and up come from one GEMM whose output rows
// are [gate (F) | up (F)], so the MLP's first projection is a single matmul.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// out (M, F); inp (M, 2F) = [gate | up].
void swiglu_forward(float* out, const float* inp, int64_t num_rows, int64_t ffn_dim);
// dinp (M, 2F) written.
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t num_rows,
                     int64_t ffn_dim);

}  // namespace moetron::cpu
