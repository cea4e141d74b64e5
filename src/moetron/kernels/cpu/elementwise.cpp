// Elementwise helpers. Below kParallelMinElements a thread team costs more than the work.
#include "moetron/kernels/cpu/elementwise.h"

#include <cstring>

namespace moetron::cpu {
namespace {
constexpr int64_t kParallelMinElements = 1 << 15;
}  // namespace

void copy(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
}

void zero(void* dst, size_t bytes) {
    if (bytes) std::memset(dst, 0, bytes);
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void axpy(float* y, float alpha, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace moetron::cpu
