// The Backend's ops as data, made from their one list (backend_ops.inc): an index per op, its
// name and the category a step's time is reported in (ProfilingBackend), and whether it is a
// GEMM (it takes a GemmPrecision). The op-parity harness checks its coverage against this list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace moetron {

// The groups a step's time is reported in.
enum class OpCategory : uint8_t {
    attention,         // attention, MLA's key/value assembly, RoPE
    gemm,              // dense linears and matmuls
    grouped_gemm,      // the experts' grouped linears
    router,            // routing, balance loss, expert loads, router bias
    permute_dispatch,  // token permutation and the expert dispatcher's row movements and layouts
    norm,              // RMSNorm
    activation,        // SwiGLU
    embedding,         // embedding lookups and their gradients
    cross_entropy,     // the loss, whole or vocabulary-parallel
    optimizer,         // AdamW, gradient norm and clipping
    quantize,          // the recipes' quantization and dequantization (the token payload's)
    other,             // copies, fills, initialization, host transfers, machine probes
};
inline constexpr size_t kNumOpCategories = static_cast<size_t>(OpCategory::other) + 1;
std::string_view op_category_name(OpCategory category);

// One enumerator per op, in the list's order.
enum class BackendOp : uint16_t {
#define MOETRON_OP(ret, op, category, params, args) op,
#include "moetron/kernels/backend_ops.inc"
};
inline constexpr size_t kNumBackendOps = 0
#define MOETRON_OP(ret, op, category, params, args) +1
#include "moetron/kernels/backend_ops.inc"
    ;

struct BackendOpInfo {
    std::string_view name;  // the Backend member's name
    OpCategory category;
    bool gemm;  // takes a GemmPrecision (MOETRON_GEMM_OP)
};
// Every op, indexed by BackendOp.
std::span<const BackendOpInfo> backend_op_list();
const BackendOpInfo& backend_op(BackendOp op);
// The op of that name; throws std::invalid_argument for a name that is no Backend op.
BackendOp backend_op_named(std::string_view name);

}  // namespace moetron
