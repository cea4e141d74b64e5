#include "moetron/core/precision.h"

#include "moetron/core/user_error.h"

namespace moetron {

Precision parse_precision(std::string_view name) {
    if (name == "fp32") return Precision::fp32;
    if (name == "bf16") return Precision::bf16;
    if (name == "mxfp8") return Precision::mxfp8;
    if (name == "fp8-blockwise") return Precision::fp8_blockwise;
    if (name == "nvfp4") return Precision::nvfp4;
    // The cluster model's old names of the same recipes.
    if (name == "fp8") MT_USER_THROW("precision 'fp8' is now spelled 'fp8-blockwise'");
    if (name == "fp4") MT_USER_THROW("precision 'fp4' is now spelled 'nvfp4'");
    MT_USER_THROW("unknown precision '{}'; use fp32, bf16, mxfp8, fp8-blockwise or nvfp4", name);
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
        case Precision::nvfp4:
            return "nvfp4";
    }
    return "?";
}

bool engine_has_recipe(Precision recipe) {
    switch (recipe) {
        case Precision::fp32:
        case Precision::bf16:
        case Precision::mxfp8:
        case Precision::fp8_blockwise:
            return true;
        case Precision::nvfp4:
            return false;
    }
    return false;
}

void require_engine_recipe(Precision recipe) {
    MT_USER_CHECK(engine_has_recipe(recipe),
                  "the engine has no {} recipe yet; simulate and plan "
                  "price it",
                  recipe == Precision::nvfp4 ? "NVFP4" : precision_name(recipe));
}

}  // namespace moetron
