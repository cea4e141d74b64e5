// GEMMs for a routed expert's few tokens that read the weight as it is stored.
//
// BLAS packs the weight into its own layout on every call: at 64 tokens per expert that copy
// (O x I floats, 2.9 MB at 1024 -> 704) costs about as much as a fifth of the arithmetic, and the
// grouped GEMM of many small experts pays it once per expert and per call. These kernels keep a
// tile of results in vector registers and stream the weight's rows straight from memory instead,
// each weight element loaded once per tile of tokens; only the tokens' side is reused from cache
// (the forward packs it, the small side, transposed).
//
// Each runs on the calling thread (the grouped GEMM hands whole experts to threads) with the
// widest vectors the CPU has: AVX-512 when it has AVX-512 F/BW/DQ/VL, else AVX2 (the build's
// baseline, x86-64-v3), chosen once at run time, so one binary runs on both (vector_isa.h; its
// MOETRON_CPU_ISA=avx2 forces AVX2).
#pragma once

#include <cstdint>

namespace moetron::cpu {

// out (M, O) = inp (M, I) @ weight (O, I)^T.
void small_linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                          int64_t in_dim, int64_t out_dim);
// dinp (M, I) = dout (M, O) @ weight (O, I): written.
void small_linear_backward_input(float* dinp, const float* dout, const float* weight,
                                 int64_t num_rows, int64_t in_dim, int64_t out_dim);
// dweight (O, I) += dout (M, O)^T @ inp (M, I): accumulated.
void small_linear_backward_weight(float* dweight, const float* dout, const float* inp,
                                  int64_t num_rows, int64_t in_dim, int64_t out_dim);

// C (m, n) = op(A) B, or C += op(A) B when accumulate, for operands laid out with strides:
// op(A)[r][k] = a[r * a_row_stride + k * a_k_stride] (so op(A) may be a transposed view), row k
// of B starts at b + k * ldb and row r of C at c + r * ldc, both contiguous along n. For blocks
// of a few hundred rows and columns at most (attention's tiles): B's rows are read in place, a
// panel of them reused from cache by every tile of C's rows.
struct StridedGemm {
    float* c;
    int64_t ldc;
    bool accumulate;
    const float* a;
    int64_t a_row_stride, a_k_stride;
    const float* b;
    int64_t ldb;
    int64_t m, n, k;
};
void small_gemm(const StridedGemm& g);

// The vector code the kernels above run on this CPU: "avx512" or "avx2".
const char* small_gemm_isa();

}  // namespace moetron::cpu
