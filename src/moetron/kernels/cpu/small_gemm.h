// GEMMs for a routed expert's few tokens that read the weight as it is stored.
//
// BLAS packs the weight into its own layout on every call: at 64 tokens per expert that copy
// (O x I floats, 2.9 MB at 1024 -> 704) costs about as much as a fifth of the arithmetic, and the
// grouped GEMM of many small experts pays it once per expert and per call. These kernels keep a
// tile of results in vector registers and stream the weight's rows straight from memory instead,
// each weight element loaded once per tile of tokens; only the tokens' side is reused from cache.
//
// Each runs on the calling thread (the grouped GEMM hands whole experts to threads) with the
// widest vectors the CPU has: AVX-512 when it has AVX-512F, else AVX2 (the build's baseline,
// x86-64-v3), chosen once at run time, so one binary runs on both.
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

// The vector code the kernels above run on this CPU: "avx512" or "avx2".
const char* small_gemm_isa();

}  // namespace moetron::cpu
