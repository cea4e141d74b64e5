// AdamW (Loshchilov & Hutter 2019) with decoupled weight decay, on a flat buffer, and the
// gradient-norm helpers for global-norm clipping.
#pragma once

#include <cstdint>

#include "moetron/kernels/op_types.h"

namespace moetron::cpu {

using moetron::AdamWParams;

// In place on params, m, v for n elements, as torch.optim.AdamW:
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                  const AdamWParams& hp);

// Sum of squares in double (the global norm adds these over buffers and ranks).
double sum_squares(const float* x, int64_t n);
// x *= factor.
void scale_inplace(float* x, int64_t n, float factor);
using moetron::clip_factor;  // kernels/op_types.h

}  // namespace moetron::cpu
