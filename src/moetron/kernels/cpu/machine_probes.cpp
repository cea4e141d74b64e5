#include "moetron/kernels/cpu/machine_probes.h"

#include <omp.h>

#include <cmath>

namespace moetron::cpu {

void stream_triad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

void exp_elementwise(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = std::exp(inp[i]);
}

void empty_launch() {
    volatile int touched = 0;  // a volatile store keeps the empty region from being removed
#pragma omp parallel
    {
        if (omp_get_thread_num() == 0) touched = 1;
    }
    (void)touched;
}

}  // namespace moetron::cpu
