// The entry points each instruction-set build of norm_kernels.inc defines; rmsnorm.cpp and
// adamw.cpp check their arguments and call the set vector_isa() picks.
#pragma once

#include <cstdint>

namespace moetron::cpu {

struct NormKernels {
    // rmsnorm.h's forward and backward; the backward's dweight is summed over rows by threads
    // that each own column_block columns (at most kMaxNormColumnBlock).
    void (*rmsnorm_forward)(float* out, float* rstd, const float* inp, const float* weight,
                            int64_t num_rows, int64_t dim, float eps);
    void (*rmsnorm_backward)(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, int64_t num_rows, int64_t dim,
                             int64_t column_block);
    // adamw.h's sum_squares: sum of x[i]^2 in double.
    double (*sum_squares)(const float* x, int64_t n);
    const char* isa;
};

// The double accumulators of one column block live on the stack (2 KiB).
inline constexpr int64_t kMaxNormColumnBlock = 256;

NormKernels norm_kernels_avx2();
NormKernels norm_kernels_avx512();

// The set for this process (vector_isa.h).
const NormKernels& norm_kernels();

}  // namespace moetron::cpu
