// RMSNorm (Zhang & Sennrich 2019): out = inp / sqrt(mean(inp^2) + eps) * weight.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// out (N, D), rstd (N) saved = 1 / sqrt(mean(inp^2) + eps).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                     int64_t num_rows, int64_t dim, float eps);
// dinp written; dweight accumulated (kernels/README.md); either may be null to skip it.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t num_rows, int64_t dim);

}  // namespace moetron::cpu
