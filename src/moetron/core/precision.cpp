#include "moetron/core/precision.h"

#include "moetron/core/user_error.h"

namespace moetron {

Precision parse_precision(std::string_view name) {
    if (name == "fp32") return Precision::fp32;
    if (name == "bf16") return Precision::bf16;
    if (name == "mxfp8") return Precision::mxfp8;
    if (name == "fp8-blockwise") return Precision::fp8_blockwise;
    MT_USER_THROW("unknown precision '{}'; use fp32, bf16, mxfp8 or fp8-blockwise", name);
}

std::string_view precision_name(Precision precision) {
    switch (precision) {
        case Precision::fp32:
            return "fp32";
        case Precision::bf16:
            return "bf16";
        case Precision::mxfp8:
            return "mxfp8";
        case Precision::fp8_blockwise:
            return "fp8-blockwise";
    }
    return "?";
}

}  // namespace moetron
