// GEMMs through BLAS: the plain matmul, the linear layer y = x W^T, and the grouped linear layer
// of the routed experts (one call for all local experts over contiguous token segments).
//
// Threads: each call uses omp_get_max_threads() OpenMP threads (one when called inside a parallel
// region), with BLAS single-threaded on blocks the threads own; the first call sets OpenBLAS's
// process-wide thread count to 1 (see matmul.cpp for why). Dimensions must fit a 32-bit int.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// One GEMM's operands and shape: C (m, n) = op(A) op(B) + beta C, row-major, with matmul()'s
// conventions below (op(A) is (m, k), A stored (k, m) when trans_a; op(B) is (k, n), B stored
// (n, k) when trans_b; beta 0: C is written without being read).
struct Gemm {
    float* c;
    const float* a;
    const float* b;
    int64_t m, n, k;
    bool trans_a, trans_b;
    float beta;
};

// Below this many FLOPs a GEMM runs on the calling thread: a parallel region costs a few
// microseconds, and 4 MFLOP take ~30 us on one core. Every CPU GEMM (this file's, the bf16
// kernel's) splits by it.
inline constexpr double kMinParallelGemmFlops = 4e6;
// The threads a GEMM may use: omp_get_max_threads(), one inside a parallel region.
int gemm_threads_available();

// C (M, N) = op(A) op(B) + beta * C, row-major. op(A) is (M, K): A is (M, K), or (K, M) when
// trans_a. op(B) is (K, N): B is (K, N), or (N, K) when trans_b.
void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a,
            bool trans_b, float beta = 0.0f);

// out (M, O) = inp (M, I) @ weight (O, I)^T.
void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                    int64_t in_dim, int64_t out_dim);
// dinp (M, I) = dout @ weight (written; skipped when null); dweight (O, I) += dout^T @ inp
// (skipped when null: a zero-bubble schedule computes the two apart).
void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int64_t num_rows, int64_t in_dim, int64_t out_dim);

// Grouped linear over expert segments: rows [offsets[e], offsets[e+1]) of inp belong to expert e
// and are multiplied by weight[e] (O, I). weight is (E, O, I); offsets has E + 1 entries,
// offsets[0] = 0, non-decreasing. A segment may be empty.
void grouped_linear_forward(float* out, const float* inp, const float* weight,
                            const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                            int64_t out_dim);
// dinp written (skipped when null); dweight (E, O, I) accumulated (skipped when null).
void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const int64_t* offsets, int64_t num_experts,
                             int64_t in_dim, int64_t out_dim);

}  // namespace moetron::cpu
