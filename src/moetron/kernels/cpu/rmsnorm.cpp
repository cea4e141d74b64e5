// RMSNorm forward and backward (Zhang & Sennrich 2019; DeepSeek-V3 `rms_norm_eps` = 1e-6).
//
// Forward, per row x of length D:  r = 1 / sqrt(mean(x^2) + eps),  out = x * r * w.
// Backward, with g = dout * w:      dx = r * g - x * r^3 * (g . x) / D,
//                                   dw += sum over rows of dout * x * r.
// The loops are norm_kernels.inc's, compiled for AVX2 and AVX-512 (sums in double).
#include "moetron/kernels/cpu/rmsnorm.h"

#include <omp.h>

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/norm_kernels_isa.h"

namespace moetron::cpu {

namespace {

// The backward's dweight columns go to threads in blocks of whole 512-bit vectors, split evenly
// over the threads (a norm of 128 or 192 columns would otherwise be one block, on one thread).
constexpr int64_t kColumnBlockRounding = 16;

void check_dims(const char* op, int64_t num_rows, int64_t dim) {
    MT_CHECK(num_rows >= 0 && dim > 0, "[{}] need num_rows >= 0 and dim > 0, got N={} D={}", op,
             num_rows, dim);
}

int64_t weight_grad_column_block(int64_t dim) {
    const int64_t threads = std::max(1, omp_get_max_threads());
    const int64_t per_thread = (dim + threads - 1) / threads;
    const int64_t rounded =
        (per_thread + kColumnBlockRounding - 1) / kColumnBlockRounding * kColumnBlockRounding;
    return std::min(rounded, kMaxNormColumnBlock);
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                     int64_t num_rows, int64_t dim, float eps) {
    check_dims("rmsnorm_forward", num_rows, dim);
    MT_CHECK(eps >= 0.0f, "[rmsnorm_forward] eps must be >= 0, got {}", eps);
    norm_kernels().rmsnorm_forward(out, rstd, inp, weight, num_rows, dim, eps);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t num_rows, int64_t dim) {
    check_dims("rmsnorm_backward", num_rows, dim);
    norm_kernels().rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, num_rows, dim,
                                    weight_grad_column_block(dim));
}

}  // namespace moetron::cpu
