// The small-GEMM kernels (small_gemm_kernels.inc) on 512-bit vectors. This file alone is compiled
// with -mavx512f (CMakeLists.txt); small_gemm.cpp calls it only on CPUs that have AVX-512.
#include <immintrin.h>

#include <cstdint>

#include "moetron/kernels/cpu/small_gemm_isa.h"

namespace moetron::cpu {
namespace {

struct Vec {
    using Reg = __m512;
    static constexpr int64_t kWidth = 16;
    // Register tile (32 vector registers): 6 rows x 4 vectors = 24 accumulators plus 4 vectors
    // of the streamed operand and a broadcast.
    static constexpr int kTileRows = 6, kTileVectors = 4;

    static Reg zero() { return _mm512_setzero_ps(); }
    static Reg load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
    static Reg broadcast(float x) { return _mm512_set1_ps(x); }
    static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
};

}  // namespace

#include "moetron/kernels/cpu/small_gemm_kernels.inc"

SmallGemmKernels small_gemm_kernels_avx512() {
    return {&forward, &backward_input, &backward_weight, &strided_gemm, "avx512"};
}

}  // namespace moetron::cpu
