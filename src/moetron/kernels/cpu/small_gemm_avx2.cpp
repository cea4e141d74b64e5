// The small-GEMM kernels (small_gemm_kernels.inc) on 256-bit vectors: AVX2 and FMA, which the
// whole build assumes (-march=x86-64-v3), so they run on every CPU the binary runs on.
#include <immintrin.h>

#include <cstdint>

#include "moetron/kernels/cpu/small_gemm_isa.h"

namespace moetron::cpu {
namespace {

struct Vec {
    using Reg = __m256;
    static constexpr int64_t kWidth = 8;
    // Register tile (16 vector registers): 6 rows x 2 vectors = 12 accumulators plus 2 vectors
    // of the streamed operand and a broadcast.
    static constexpr int kTileRows = 6, kTileVectors = 2;

    static Reg zero() { return _mm256_setzero_ps(); }
    static Reg load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
    static Reg broadcast(float x) { return _mm256_set1_ps(x); }
    static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

#include "moetron/kernels/cpu/small_gemm_kernels.inc"

SmallGemmKernels small_gemm_kernels_avx2() {
    return {&forward, &backward_input, &backward_weight, &strided_gemm, "avx2"};
}

}  // namespace moetron::cpu
