// CUDA versions of CPU kernels (kernels/cpu/*.h): same names, same argument order, the stream
// last. Activations and weights are float or bf16 (storage), accumulation is always float32.
// Pointers are device pointers. Includable from plain C++ (no CUDA headers).
#pragma once

#include <cstdint>

#include "moetron/core/dtype.h"
#include "moetron/kernels/cuda/device.h"

namespace moetron::cuda {

// out (M, D), rstd (M) float; see cpu/rmsnorm.h.
template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t num_rows,
                     int64_t dim, float eps, cudaStream_t stream);
// dinp written; dweight (float, D) accumulated.
template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t num_rows, int64_t dim, cudaStream_t stream);

// out (M, F) = silu(gate) * up with inp (M, 2F) = [gate | up]; see cpu/swiglu.h.
template <class T>
void swiglu_forward(T* out, const T* inp, int64_t num_rows, int64_t ffn_dim, cudaStream_t stream);
template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int64_t num_rows, int64_t ffn_dim,
                     cudaStream_t stream);

// AdamW on fp32 master weights and fp32 moments (cpu/adamw.h semantics); when params_bf16 is
// non-null, the updated weights are also written there in bf16 for the next forward.
void adamw_update(float* params, bf16* params_bf16, float* m, float* v, const float* grads,
                  int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t step, cudaStream_t stream);

// Round-to-nearest-even conversion, as core/dtype.h.
void convert_f32_to_bf16(bf16* out, const float* inp, int64_t n, cudaStream_t stream);

// ---- flat float32 buffers (cpu/elementwise.h, cpu/adamw.h); vector.cu ----

// y += x
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);
// y += alpha * x
void axpy(float* y, float alpha, const float* x, int64_t n, cudaStream_t stream);
// out = a + b
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
// x *= factor
void scale_inplace(float* x, int64_t n, float factor, cudaStream_t stream);

// Doubles of scratch sum_squares needs in `partials` (device memory).
inline constexpr int kSumSquaresPartials = 1024;
// *result (one device double) = sum of x[i]^2 in double, added in a fixed order, so that the
// same buffer always gives the same bits.
void sum_squares(double* result, double* partials, const float* x, int64_t n, cudaStream_t stream);

}  // namespace moetron::cuda
