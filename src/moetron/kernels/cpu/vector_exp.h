// exp(x) for float32 in a form the compiler vectorizes (no library call, no branch), for the
// kernels that take an exponential per element of a large block (attention's probabilities,
// SwiGLU's sigmoid).
// std::exp does not vectorize without -ffast-math and costs more per element than attention's
// arithmetic around it. Relative error below 2e-7 over [-87.3, 88]; 0 below -87.3 (and for
// -inf), +inf above 88 (where exp is within 2x of the largest float).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace moetron::cpu {

inline float exp_vectorizable(float x) {
    constexpr float kLog2e = 1.44269504088896341f;
    // ln 2 in two parts: n * kLn2High is exact for |n| < 2^10, so r keeps its low bits.
    constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
    constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    constexpr float kMinInput = -87.3f, kMaxInput = 88.0f;
    const float clamped_low = x < kMinInput ? kMinInput : x;
    const float clamped = clamped_low > kMaxInput ? kMaxInput : clamped_low;
    // exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln 2 / 2.
    const float n = (clamped * kLog2e + kRoundMagic) - kRoundMagic;
    const float r = (clamped - n * kLn2High) - n * kLn2Low;
    // exp(r) by its Taylor series to r^7 / 7! (error < 2e-8 for |r| <= 0.347).
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float two_to_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
    const float result = p * two_to_n;
    const float low_fixed = x < kMinInput ? 0.0f : result;
    return x > kMaxInput ? std::numeric_limits<float>::infinity() : low_fixed;
}

// 1 / (1 + e^-x), vectorizable as exp_vectorizable is: for x -> -inf, e^-x overflows to inf and
// the quotient is a clean 0.
inline float sigmoid_vectorizable(float x) {
    return 1.0f / (1.0f + exp_vectorizable(-x));
}

}  // namespace moetron::cpu
