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

inline constexpr float kE4m3Max = 448.0f;  // 1.75 * 2^8, bit pattern 0x7E
inline constexpr uint8_t kE4m3NaN = 0x7F;  // S.1111.111; E4M3 has no infinity

// Rounds to nearest even and saturates: anything beyond +-448 (infinities included) becomes
// +-448, the behaviour of the GPU's cvt.rn.satfinite that the recipes quantize with. NaN becomes
// 0x7F whatever its sign. Bit arithmetic (no libm calls): this runs once per GEMM input element.
inline uint8_t encode_e4m3(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    const uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
    if (magnitude_bits > 0x7F800000u) return kE4m3NaN;
    const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
    if (magnitude_bits >= 0x43E00000u) return sign | 0x7E;  // >= 448
    if (magnitude_bits >= 0x3C800000u) {                    // >= 2^-6: an E4M3 normal
        // Round the 23-bit mantissa to 3 bits, ties to even; a carry moves into the exponent.
        const uint32_t rounded = magnitude_bits + 0x7FFFFu + ((magnitude_bits >> 20) & 1u);
        // float32 exponent and 3 mantissa bits, rebiased from 127 to 7.
        return sign | static_cast<uint8_t>((rounded >> 20) - ((127u - 7u) << 3));
    }
    // Subnormal: |x| in units of 2^-9 (exact), rounded to an integer by the float adder
    // (round to nearest even, the default mode: adding 2^23 leaves no fraction bits).
    const float units = (std::bit_cast<float>(magnitude_bits) * 512.0f + 0x1p23f) - 0x1p23f;
    return sign | static_cast<uint8_t>(units);
}

inline float decode_e4m3(uint8_t bits) {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
    const uint32_t code = bits & 0x7Fu;
    if (code == 0x7F) return std::numeric_limits<float>::quiet_NaN();
    if (code < 8) {  // subnormal (or zero): code x 2^-9, exact
        const float magnitude = static_cast<float>(code) * 0x1p-9f;
        return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
    }
    return std::bit_cast<float>(((code + ((127u - 7u) << 3)) << 20) | sign);
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
    if (bits == 0) return 0x1p-127f;  // a float32 subnormal
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 23);
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
