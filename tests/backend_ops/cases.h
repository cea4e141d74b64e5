// The op-parity registry's cases, one registering function per section of the op list
// (kernels/backend_ops.inc), in three files: cases.cpp (data movement, GEMMs, norms, attention,
// embedding and loss, optimizer, machine probes), cases_moe.cpp (routing, dispatch, the model's
// ops) and cases_low_precision.cpp (quantization and the recipes' GEMMs). op_cases() (registry.h)
// calls them in this order. Each op has a shape small enough for the finite-difference check
// (harness.h: kMaxFiniteDifferenceElements), odd sizes, a larger shape for parity only, and an
// empty one where the op allows it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops/registry.h"

namespace moetron::backend_ops {

inline constexpr int32_t kIgnoreIndex = -100;
// GEMMs sum in different orders on different backends: float32 rounding grows with K.
inline constexpr double kGemmParity = 1e-4;

// A linear layer's case (forward and backward) and the experts' grouped one, with the GEMMs in
// gemm's format: the float32 cases and every recipe's share them.
void add_linear_case(Registry& r, const std::string& name, int64_t rows, int64_t in, int64_t out,
                     GemmPrecision gemm, const Fill& weight_fill);
void add_grouped_linear_case(Registry& r, const std::string& name,
                             const std::vector<double>& offsets, int64_t in, int64_t out,
                             GemmPrecision gemm, const Fill& weight_fill);

void register_elementwise(Registry& r);
void register_gemms(Registry& r);
void register_norms_and_activations(Registry& r);
void register_rope(Registry& r);
void register_attention(Registry& r);
void register_embedding(Registry& r);
void register_cross_entropy(Registry& r);
void register_routing(Registry& r);
void register_optimizer(Registry& r);
void register_dispatch(Registry& r);
void register_model_ops(Registry& r);
void register_machine_probes(Registry& r);
void register_low_precision(Registry& r);
void register_recipe_gemms(Registry& r);

}  // namespace moetron::backend_ops
