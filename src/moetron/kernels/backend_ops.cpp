#include "moetron/kernels/backend_ops.h"

#include <fmt/format.h>

#include <array>
#include <stdexcept>

namespace moetron {

namespace {

constexpr std::array<BackendOpInfo, kNumBackendOps> kBackendOps{{
#define MOETRON_OP(ret, op, category, params, args) {#op, OpCategory::category, false},
#define MOETRON_GEMM_OP(ret, op, category, params, args) {#op, OpCategory::category, true},
#include "moetron/kernels/backend_ops.inc"
}};

}  // namespace

std::string_view op_category_name(OpCategory category) {
    switch (category) {
        case OpCategory::attention:
            return "attention";
        case OpCategory::gemm:
            return "GEMMs";
        case OpCategory::grouped_gemm:
            return "grouped GEMMs";
        case OpCategory::router:
            return "router";
        case OpCategory::permute_dispatch:
            return "permute/dispatch";
        case OpCategory::norm:
            return "norms";
        case OpCategory::activation:
            return "activations";
        case OpCategory::embedding:
            return "embedding";
        case OpCategory::cross_entropy:
            return "cross-entropy";
        case OpCategory::optimizer:
            return "optimizer";
        case OpCategory::quantize:
            return "quantize";
        case OpCategory::other:
            return "other";
    }
    return "?";
}

std::span<const BackendOpInfo> backend_op_list() {
    return kBackendOps;
}

const BackendOpInfo& backend_op(BackendOp op) {
    return kBackendOps[static_cast<size_t>(op)];
}

BackendOp backend_op_named(std::string_view name) {
    for (size_t i = 0; i < kBackendOps.size(); ++i) {
        if (kBackendOps[i].name == name) return static_cast<BackendOp>(i);
    }
    throw std::invalid_argument(fmt::format("'{}' is not a Backend op", name));
}

}  // namespace moetron
