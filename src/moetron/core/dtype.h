// Element types. Compute on the CPU is float32; bf16 is the storage type of the GPU path and of
// exported weights; f64 exists for finite-difference tests.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moetron {

enum class DType : uint8_t { f32, bf16, f64, i32, i64, u8 };

constexpr size_t dtype_size_bytes(DType t) {
    switch (t) {
        case DType::f32:
            return 4;
        case DType::bf16:
            return 2;
        case DType::f64:
            return 8;
        case DType::i32:
            return 4;
        case DType::i64:
            return 8;
        case DType::u8:
            return 1;
    }
    return 0;
}

// Names as safetensors spells them (F32, BF16, ...), so checkpoint code can use them directly.
std::string_view dtype_name(DType t);
// Inverse of dtype_name; throws moetron::Error naming the unknown string.
DType dtype_from_name(std::string_view name);

// bfloat16: the top 16 bits of an IEEE float32. Conversion from float rounds to nearest, ties to
// even; NaN stays NaN (quiet) instead of rounding into infinity.
struct bf16 {
    uint16_t bits = 0;

    bf16() = default;
    explicit bf16(float f) : bits(from_float(f)) {}
    explicit operator float() const { return to_float(bits); }

    static constexpr uint16_t from_float(float f) {
        uint32_t u = std::bit_cast<uint32_t>(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
        uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
        return static_cast<uint16_t>((u + rounding_bias) >> 16);
    }
    static constexpr float to_float(uint16_t b) {
        return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
    }
};
static_assert(sizeof(bf16) == 2);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
    return DType::f32;
}
template <>
constexpr DType dtype_of<bf16>() {
    return DType::bf16;
}
template <>
constexpr DType dtype_of<double>() {
    return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
    return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
    return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
    return DType::u8;
}

// Bulk conversions (round to nearest even), used by export and the GPU upload path.
void convert_f32_to_bf16(bf16* out, const float* inp, size_t n);
void convert_bf16_to_f32(float* out, const bf16* inp, size_t n);

}  // namespace moetron
