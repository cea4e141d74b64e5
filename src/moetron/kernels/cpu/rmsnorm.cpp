// RMSNorm forward and backward (Zhang & Sennrich 2019; DeepSeek-V3 `rms_norm_eps` = 1e-6).
//
// Forward, per row x of length D:  r = 1 / sqrt(mean(x^2) + eps),  out = x * r * w.
// Backward, with g = dout * w:      dx = r * g - x * r^3 * (g . x) / D,
//                                   dw += sum over rows of dout * x * r.
#include "moetron/kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "moetron/core/error.h"

namespace moetron::cpu {

namespace {

// Columns of dweight one thread owns in the backward's reduction over rows. A block's double
// accumulators live on the stack (256 doubles = 2 KiB), so the kernel allocates nothing.
constexpr int64_t kWeightGradColumnBlock = 256;

void check_dims(const char* op, int64_t num_rows, int64_t dim) {
    MT_CHECK(num_rows >= 0 && dim > 0, "[{}] need num_rows >= 0 and dim > 0, got N={} D={}", op,
             num_rows, dim);
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                     int64_t num_rows, int64_t dim, float eps) {
    check_dims("rmsnorm_forward", num_rows, dim);
    MT_CHECK(eps >= 0.0f, "[rmsnorm_forward] eps must be >= 0, got {}", eps);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < num_rows; ++row) {
        const float* x = inp + row * dim;
        float* y = out + row * dim;
        // Sum of squares in double: for D in the thousands a float sum loses ~3 digits.
        double sum_squares = 0.0;
#pragma omp simd reduction(+ : sum_squares)
        for (int64_t i = 0; i < dim; ++i) sum_squares += static_cast<double>(x[i]) * x[i];
        const float r = static_cast<float>(1.0 / std::sqrt(sum_squares / dim + eps));
        for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * r * weight[i];
        rstd[row] = r;
    }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t num_rows, int64_t dim) {
    check_dims("rmsnorm_backward", num_rows, dim);

    // dinp: rows are independent.
    if (dinp != nullptr) {
#pragma omp parallel for schedule(static)
        for (int64_t row = 0; row < num_rows; ++row) {
            const float* x = inp + row * dim;
            const float* dy = dout + row * dim;
            float* dx = dinp + row * dim;
            const float r = rstd[row];
            double g_dot_x = 0.0;  // sum_i dout_i * w_i * x_i
#pragma omp simd reduction(+ : g_dot_x)
            for (int64_t i = 0; i < dim; ++i)
                g_dot_x += static_cast<double>(dy[i]) * weight[i] * x[i];
            const float x_coeff = static_cast<float>(g_dot_x * r * r * r / dim);
            for (int64_t i = 0; i < dim; ++i) dx[i] = r * dy[i] * weight[i] - x_coeff * x[i];
        }
    }

    // dweight: a reduction over rows. Each thread owns a block of columns and walks all rows, so
    // there is no race, no per-thread copy of dweight, and the inner loop stays contiguous.
    if (dweight != nullptr) {
        const int64_t num_blocks = (dim + kWeightGradColumnBlock - 1) / kWeightGradColumnBlock;
#pragma omp parallel for schedule(static)
        for (int64_t block = 0; block < num_blocks; ++block) {
            const int64_t first = block * kWeightGradColumnBlock;
            const int64_t width = std::min(kWeightGradColumnBlock, dim - first);
            double sums[kWeightGradColumnBlock] = {};
            for (int64_t row = 0; row < num_rows; ++row) {
                const float* x = inp + row * dim + first;
                const float* dy = dout + row * dim + first;
                const double r = rstd[row];
                for (int64_t i = 0; i < width; ++i)
                    sums[i] += static_cast<double>(dy[i]) * x[i] * r;
            }
            for (int64_t i = 0; i < width; ++i) dweight[first + i] += static_cast<float>(sums[i]);
        }
    }
}

}  // namespace moetron::cpu
