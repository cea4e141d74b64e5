// kernels/cpu/adamw: AdamW against a hand-derived first step and a float64 reference of
// torch.optim.AdamW for three steps; the global-norm clipping helpers; and the elementwise
// helpers (kernels/cpu/elementwise) that the optimizer step and the residual stream use.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/kernels/cpu/elementwise.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;

TEST(AdamW, FirstStepIsSignedLearningRateAfterDecay) {
    // Step 1 from m = v = 0: m_hat = g and v_hat = g^2 exactly, so the update is
    // lr * g / (|g| + eps), after the decoupled decay p *= 1 - lr*wd.
    const cpu::AdamWParams hp{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    std::vector<float> p = {1.0f, -2.0f, 0.5f, 0.0f}, m(4, 0.0f), v(4, 0.0f);
    const std::vector<float> g = {0.3f, -4.0f, 1e-3f, 0.0f};
    cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), 4, hp);
    const double expected[4] = {
        1.0 * (1 - 0.001) - 0.01 * 0.3 / (0.3 + 1e-8),
        -2.0 * (1 - 0.001) - 0.01 * -4.0 / (4.0 + 1e-8),
        0.5 * (1 - 0.001) - 0.01 * 1e-3 / (1e-3 + 1e-8),
        0.0,  // zero gradient, zero parameter: 0 / (0 + eps) = 0
    };
    expect_close("adamw", "step 1 params vs closed form", compare(p.data(), expected, 4), 1e-6);
    const double expected_m[4] = {0.1 * 0.3, 0.1 * -4.0, 0.1 * 1e-3, 0.0};
    const double expected_v[4] = {0.05 * 0.09, 0.05 * 16.0, 0.05 * 1e-6, 0.0};
    expect_close("adamw", "step 1 m", compare(m.data(), expected_m, 4, 1e-8), 1e-6);
    expect_close("adamw", "step 1 v", compare(v.data(), expected_v, 4, 1e-10), 1e-6);
}

TEST(AdamW, ThreeStepsMatchFloat64Reference) {
    const int64_t n = 64;
    auto p = testing::random_floats(n, 1);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    std::vector<double> p64 = testing::to_double(p), m64(n, 0.0), v64(n, 0.0);
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;

    for (int64_t step = 1; step <= 3; ++step) {
        const auto g = testing::random_floats(n, 100 + step, 0.5f);
        cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), n,
                          {static_cast<float>(lr), 0.9f, 0.95f, 1e-8f, 0.1f, step});
        // torch.optim.AdamW, written out: decay, moments, bias-corrected step.
        for (int64_t i = 0; i < n; ++i) {
            p64[i] *= 1 - lr * wd;
            m64[i] = b1 * m64[i] + (1 - b1) * g[i];
            v64[i] = b2 * v64[i] + (1 - b2) * g[i] * g[i];
            const double m_hat = m64[i] / (1 - std::pow(b1, step));
            const double v_hat = v64[i] / (1 - std::pow(b2, step));
            p64[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
        }
    }
    expect_close("adamw", "params after 3 steps", compare(p.data(), p64.data(), n), 1e-6);
    expect_close("adamw", "m after 3 steps", compare(m.data(), m64.data(), n), 1e-5);
    expect_close("adamw", "v after 3 steps", compare(v.data(), v64.data(), n, 1e-4), 1e-5);
}

TEST(AdamW, ZeroGradientOnlyDecays) {
    std::vector<float> p = {2.0f, -3.0f}, m(2, 0.0f), v(2, 0.0f), g(2, 0.0f);
    cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), 2,
                      {0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1});
    EXPECT_FLOAT_EQ(p[0], 2.0f * 0.95f);
    EXPECT_FLOAT_EQ(p[1], -3.0f * 0.95f);
}

TEST(AdamW, BadHyperparametersAreAnError) {
    std::vector<float> p(1), m(1), v(1), g(1);
    EXPECT_THROW(cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), 1,
                                   {0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 0}),
                 Error);  // step is 1-based
    EXPECT_THROW(cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), 1,
                                   {0.1f, 1.0f, 0.999f, 1e-8f, 0.0f, 1}),
                 Error);  // beta1 = 1 divides by zero in the bias correction
}

TEST(GradNorm, SumSquaresIsExactInDouble) {
    // sum_{i=1}^{n} i^2 = n(n+1)(2n+1)/6 = 333,338,333,350,000 for n = 100,000: every partial sum
    // is an integer below 2^53, so a double accumulation is exact, where float would not be.
    const int64_t n = 100000;
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i + 1);
    EXPECT_EQ(cpu::sum_squares(x.data(), n), 333338333350000.0);
    EXPECT_EQ(cpu::sum_squares(x.data(), 0), 0.0);
}

TEST(GradNorm, ClipFactorAsTorchClipGradNorm) {
    EXPECT_EQ(cpu::clip_factor(0.5, 1.0f), 1.0f);  // within the limit
    EXPECT_EQ(cpu::clip_factor(0.0, 1.0f), 1.0f);  // zero gradient
    EXPECT_FLOAT_EQ(cpu::clip_factor(10.0, 1.0f), static_cast<float>(1.0 / (10.0 + 1e-6)));
    EXPECT_EQ(cpu::clip_factor(10.0, 0.0f), 1.0f);  // max_norm <= 0 disables clipping
    EXPECT_EQ(cpu::clip_factor(10.0, -1.0f), 1.0f);
    EXPECT_LT(cpu::clip_factor(1.0, 1.0f), 1.0f);  // norm == max_norm: torch's 1e-6 still bites
    EXPECT_TRUE(std::isnan(cpu::clip_factor(std::nan(""), 1.0f)));  // surfaced, not hidden

    // Clipping a gradient with the factor brings its norm to max_norm.
    std::vector<float> g = {3.0f, 4.0f};  // norm 5
    const float factor = cpu::clip_factor(std::sqrt(cpu::sum_squares(g.data(), 2)), 2.0f);
    cpu::scale_inplace(g.data(), 2, factor);
    EXPECT_NEAR(std::sqrt(cpu::sum_squares(g.data(), 2)), 2.0, 1e-6);
}

TEST(Elementwise, AddAxpyAddInplace) {
    const int64_t n = 70000;  // above the parallel threshold
    const auto a = testing::random_floats(n, 7), b = testing::random_floats(n, 8);
    std::vector<float> out(n), y = a, z = a;
    cpu::add(out.data(), a.data(), b.data(), n);
    cpu::add_inplace(y.data(), b.data(), n);
    cpu::axpy(z.data(), -0.5f, b.data(), n);
    for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], a[i] + b[i]) << i;
        ASSERT_EQ(y[i], a[i] + b[i]) << i;
        ASSERT_FLOAT_EQ(z[i], a[i] - 0.5f * b[i]) << i;
    }
}

}  // namespace
}  // namespace moetron
