// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization") written to match
// torch.optim.AdamW's single-tensor path operation for operation, and the global-norm helpers of
// torch.nn.utils.clip_grad_norm_.
#include "moetron/kernels/cpu/adamw.h"

#include <cmath>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/norm_kernels_isa.h"

namespace moetron::cpu {

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                  const AdamWParams& hp) {
    MT_CHECK(hp.step >= 1, "[adamw] step must be >= 1 (bias correction is 1-based), got {}",
             hp.step);
    MT_CHECK(hp.beta1 >= 0.0f && hp.beta1 < 1.0f && hp.beta2 >= 0.0f && hp.beta2 < 1.0f,
             "[adamw] betas must be in [0, 1), got ({}, {})", hp.beta1, hp.beta2);
    MT_CHECK(hp.eps >= 0.0f, "[adamw] eps must be >= 0, got {}", hp.eps);

    // Scalars in double, as torch computes them in Python floats before the float32 kernels.
    const double t = static_cast<double>(hp.step);
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(hp.beta1), t);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(hp.beta2), t);
    const float step_size = static_cast<float>(hp.lr / bias_correction1);
    const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    const float decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
    const float one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
    const float one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
    const float beta2 = hp.beta2, eps = hp.eps;
    // torch's lerp switches formula at weight 0.5 for accuracy; the branch is loop-invariant.
    const bool small_lerp_weight = one_minus_beta1 < 0.5f;

#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float g = grads[i];
        const float p = params[i] * decay;     // param.mul_(1 - lr*wd)
        const float m_new = small_lerp_weight  // exp_avg.lerp_(g, 1 - b1)
                                ? m[i] + one_minus_beta1 * (g - m[i])
                                : g - (g - m[i]) * (1.0f - one_minus_beta1);
        const float v_new = v[i] * beta2 + one_minus_beta2 * g * g;
        const float denom = std::sqrt(v_new) / bias_correction2_sqrt + eps;
        params[i] = p - step_size * (m_new / denom);  // param.addcdiv_(m, denom, -step_size)
        m[i] = m_new;
        v[i] = v_new;
    }
}

double sum_squares(const float* x, int64_t n) {
    return norm_kernels().sum_squares(x, n);  // norm_kernels.inc: in double, AVX2 or AVX-512
}

void scale_inplace(float* x, int64_t n, float factor) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace moetron::cpu
