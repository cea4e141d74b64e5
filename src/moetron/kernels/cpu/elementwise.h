// Data movement and small elementwise helpers the layers need between the bigger kernels.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moetron::cpu {

// The CPU's ordering and host transfers: every op has finished when it returns, so there is
// nothing to wait for, and host memory is the CPU's memory (the copies are memcpy).
inline void synchronize() {}
void copy(void* dst, const void* src, size_t bytes);
inline void copy_to_host(void* host_dst, const void* src, size_t bytes) {
    copy(host_dst, src, bytes);
}
inline void copy_from_host(void* dst, const void* host_src, size_t bytes) {
    copy(dst, host_src, bytes);
}
void zero(void* dst, size_t bytes);

// y += x
void add_inplace(float* y, const float* x, int64_t n);
// y += alpha * x
void axpy(float* y, float alpha, const float* x, int64_t n);
// out = a + b
void add(float* out, const float* a, const float* b, int64_t n);

}  // namespace moetron::cpu
