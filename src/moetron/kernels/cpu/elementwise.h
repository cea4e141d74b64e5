// Small elementwise helpers the layers need between the bigger kernels.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// y += x
void add_inplace(float* y, const float* x, int64_t n);
// y += alpha * x
void axpy(float* y, float alpha, const float* x, int64_t n);
// out = a + b
void add(float* out, const float* a, const float* b, int64_t n);

}  // namespace moetron::cpu
