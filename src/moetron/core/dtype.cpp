#include "moetron/core/dtype.h"

#include "moetron/core/error.h"

namespace moetron {

std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::f32:
            return "F32";
        case DType::bf16:
            return "BF16";
        case DType::f64:
            return "F64";
        case DType::i32:
            return "I32";
        case DType::i64:
            return "I64";
        case DType::u8:
            return "U8";
    }
    return "?";
}

DType dtype_from_name(std::string_view name) {
    for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64, DType::u8}) {
        if (dtype_name(t) == name) return t;
    }
    MT_THROW("[dtype] unknown dtype '{}' (known: F32, BF16, F64, I32, I64, U8)", name);
}

void convert_f32_to_bf16(bf16* out, const float* inp, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i].bits = bf16::from_float(inp[i]);
}

void convert_bf16_to_f32(float* out, const bf16* inp, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16::to_float(inp[i].bits);
}

}  // namespace moetron
