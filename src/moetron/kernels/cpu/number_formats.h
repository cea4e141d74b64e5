// The low-precision number formats of the training recipes, one value at a time: FP8 E4M3 (the
// OCP 8-bit "fn" variant: no infinities, one NaN pattern per sign, largest finite 448), the E8M0
// power-of-two scale of the OCP Microscaling (MX) v1.0 formats, and bfloat16. Every conversion
// from float32 rounds to nearest, ties to even, and keeps subnormals (no flush to zero), so that
// tools/reference/make_quantize_reference.py's independent implementation agrees bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace moetron::cpu {

// ---- E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits ----

inline constexpr float kE4m3Max = 448.0f;     // 1.75 * 2^8, bit pattern 0x7E
inline constexpr uint8_t kE4m3NaN = 0x7F;     // S.1111.111; E4M3 has no infinity
inline constexpr int kE4m3MinNormalExp = -6;  // smallest normal 2^-6; subnormals step by 2^-9

// Rounds to nearest even and saturates: anything beyond +-448 (infinities included) becomes
// +-448, the behaviour of the GPU's cvt.rn.satfinite that the recipes quantize with. NaN becomes
// 0x7F whatever its sign.
inline uint8_t encode_e4m3(float x) {
    if (std::isnan(x)) return kE4m3NaN;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const float magnitude = std::fabs(x);
    if (magnitude >= kE4m3Max) return sign | 0x7E;
    int exponent = std::ilogb(magnitude);  // floor(log2 |x|); very negative for 0 and subnormals
    if (magnitude == 0.0f || exponent < kE4m3MinNormalExp) exponent = kE4m3MinNormalExp;
    // |x| in units of this binade's spacing 2^(exponent - 3): exact (a power-of-two scaling), and
    // the rounding to an integer is the only rounding. A carry to 16 lands on the next binade's
    // first code, which the sum below encodes correctly.
    const auto units = static_cast<int>(std::nearbyint(std::ldexp(magnitude, 3 - exponent)));
    // Below 2^-6 exponent is -6 and units < 8: the sum is the subnormal code `units` itself.
    const int code = ((exponent + 7) << 3) + (units - 8);
    return static_cast<uint8_t>(sign | code);
}

inline float decode_e4m3(uint8_t bits) {
    const int exponent = (bits >> 3) & 0xF, mantissa = bits & 0x7;
    if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
    const float magnitude = exponent == 0
                                ? std::ldexp(static_cast<float>(mantissa), -9)
                                : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
    return (bits & 0x80) ? -magnitude : magnitude;
}

// ---- E8M0: an unsigned 8-bit exponent, 2^(bits - 127); 0xFF is NaN ----

inline constexpr uint8_t kE8m0NaN = 0xFF;

// Rounds up to the next power of two (Transformer Engine's float_to_e8m0, the PTX
// cvt.rp.satfinite.ue8m0): NaN -> 0xFF; +Inf and anything above 2^127 -> 0xFE (2^127); 0 -> 0
// (2^-127); values at most 2^-127 -> 0. Only the magnitude is looked at (scales come from
// absolute maxima).
inline uint8_t encode_e8m0_round_up(float x) {
    if (std::isnan(x)) return kE8m0NaN;
    if (std::isinf(x)) return 0xFE;
    const uint32_t bits = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
    if (bits == 0) return 0;
    uint32_t exponent = bits >> 23;
    const uint32_t mantissa = bits & 0x7FFFFFu;
    // A float32 subnormal at most 2^-127 (mantissa <= half) rounds up to 2^-127 itself.
    const bool at_or_below_smallest = exponent == 0 && mantissa <= 0x400000u;
    if (mantissa > 0 && exponent != 0xFE && !at_or_below_smallest) ++exponent;
    return static_cast<uint8_t>(exponent);
}

inline float decode_e8m0(uint8_t bits) {
    if (bits == kE8m0NaN) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

// ---- bfloat16: the upper half of a float32 ----

// Round to nearest even on the 16 dropped bits; NaN stays NaN (quieted), overflow becomes Inf.
inline uint16_t encode_bf16(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
    const uint32_t round_bias = 0x7FFFu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>((bits + round_bias) >> 16);
}

inline float decode_bf16(uint16_t bits) {
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace moetron::cpu
