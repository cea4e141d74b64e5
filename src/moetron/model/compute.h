// What the model's layers compute with: the backend that runs their ops, and the number format of
// each GEMM, named by the GEMM's role and resolved from the run's recipe (--precision,
// core/precision.h). The precision is a property of each GEMM call (kernels/op_types.h's
// GemmPrecision), as ggml sets a matmul's precision on the op; the recipe below decides it.
//
// The recipe's roles (docs/low-precision.md gives the sources):
//   layer, expert  the recipe's format: the linear layers (attention projections, dense and shared
//                  expert MLPs, MTP's projection) and the routed experts' grouped GEMMs
//   router         float32 under every recipe (DeepSeek-V3 keeps its gating in high precision)
//   head           bf16 under the bf16 recipe (as Megatron-LM's --bf16 runs the output layer),
//                  float32 under the FP8 recipes (DeepSeek-V3 keeps the head in higher precision)
#pragma once

#include <cstdint>

#include "moetron/core/precision.h"
#include "moetron/kernels/backend.h"

namespace moetron {

enum class GemmRole : uint8_t { layer, expert, router, head };

// The format of a GEMM of `role` under `recipe` (the table above).
Precision gemm_format(Precision recipe, GemmRole role);

struct ModelCompute {
    // Runs every op of the model (under zb-h1: the split backward,
    // kernels/split_backward_backend.h).
    Backend& ops;
    // The backend below a split backward, for the GEMMs whose backward stays whole in B: the
    // router's and the output head's (they are cheap, and the head's operands would be the
    // stash's largest). ops itself when nothing splits.
    Backend& whole_backward;
    Precision recipe = Precision::fp32;

    GemmPrecision gemm(GemmRole role) const { return {gemm_format(recipe, role)}; }
};

}  // namespace moetron
