// kernels/cpu/vector_exp: exp_vectorizable against std::exp in double over the whole float range
// it handles, and its ends (0 below -87.3 and for -inf, +inf above 88); sigmoid_vectorizable
// against the exact sigmoid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/kernels/cpu/vector_exp.h"

namespace moetron {
namespace {

TEST(VectorExp, RelativeErrorBelow3e7FromMinus87To88) {
    double worst = 0, worst_x = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        const double exact = std::exp(static_cast<double>(x));
        const double error = std::fabs(cpu::exp_vectorizable(x) - exact) / exact;
        if (error > worst) worst = error, worst_x = x;
    }
    EXPECT_LT(worst, 3e-7) << "at x = " << worst_x;
    EXPECT_EQ(cpu::exp_vectorizable(0.0f), 1.0f);
}

TEST(VectorExp, UnderflowIsZeroOverflowIsInfinity) {
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(cpu::exp_vectorizable(-inf), 0.0f);
    EXPECT_EQ(cpu::exp_vectorizable(-1000.0f), 0.0f);
    EXPECT_EQ(cpu::exp_vectorizable(-87.5f), 0.0f);
    EXPECT_GT(cpu::exp_vectorizable(-87.2f), 0.0f);
    EXPECT_EQ(cpu::exp_vectorizable(100.0f), inf);
    EXPECT_EQ(cpu::exp_vectorizable(inf), inf);
}

// The router's and SwiGLU's sigmoid: within 4e-7 of the exact one, exactly 0 and 1 at the ends.
TEST(VectorExp, SigmoidMatchesExactAndSaturatesCleanly) {
    double worst = 0, worst_x = 0;
    for (float x = -80.0f; x <= 80.0f; x += 0.0113f) {
        const double exact = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
        const double error = std::fabs(cpu::sigmoid_vectorizable(x) - exact) / exact;
        if (error > worst) worst = error, worst_x = x;
    }
    EXPECT_LT(worst, 4e-7) << "at x = " << worst_x;
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(cpu::sigmoid_vectorizable(-inf), 0.0f);
    EXPECT_EQ(cpu::sigmoid_vectorizable(-200.0f), 0.0f);
    EXPECT_EQ(cpu::sigmoid_vectorizable(200.0f), 1.0f);
    EXPECT_EQ(cpu::sigmoid_vectorizable(inf), 1.0f);
    EXPECT_EQ(cpu::sigmoid_vectorizable(0.0f), 0.5f);
}

}  // namespace
}  // namespace moetron
