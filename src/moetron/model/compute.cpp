#include "moetron/model/compute.h"

namespace moetron {

Precision gemm_format(Precision recipe, GemmRole role) {
    switch (role) {
        case GemmRole::layer:
        case GemmRole::expert:
            return recipe;
        case GemmRole::router:
            return Precision::fp32;
        case GemmRole::head:
            return recipe == Precision::bf16 ? Precision::bf16 : Precision::fp32;
    }
    return recipe;
}

}  // namespace moetron
