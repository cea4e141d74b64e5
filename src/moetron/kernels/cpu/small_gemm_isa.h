// The entry points each instruction-set build of small_gemm_kernels.inc defines (small_gemm.h
// says what they compute); small_gemm.cpp picks one set at run time.
#pragma once

#include <cstdint>

#include "moetron/kernels/cpu/small_gemm.h"

namespace moetron::cpu {

struct SmallGemmKernels {
    void (*forward)(float* out, const float* inp, const float* weight, int64_t num_rows,
                    int64_t in_dim, int64_t out_dim);
    void (*backward_input)(float* dinp, const float* dout, const float* weight, int64_t num_rows,
                           int64_t in_dim, int64_t out_dim);
    void (*backward_weight)(float* dweight, const float* dout, const float* inp, int64_t num_rows,
                            int64_t in_dim, int64_t out_dim);
    void (*gemm)(const StridedGemm& g);
    const char* isa;
};

SmallGemmKernels small_gemm_kernels_avx2();
SmallGemmKernels small_gemm_kernels_avx512();

}  // namespace moetron::cpu
