// The CPU reference backend: every op of kernels/backend_ops.inc, each calling the cpu:: kernel of
// its name (float32 compute, OpenMP over rows, GEMMs through OpenBLAS), the GEMMs in the recipes'
// low-precision formats through RecipeGemms (recipe_gemms.h).
#pragma once

#include <memory>

#include "moetron/kernels/backend.h"
#include "moetron/kernels/cpu/recipe_gemms.h"

namespace moetron {

struct CpuBackendOptions {
    cpu::Bf16Gemm bf16_gemm = cpu::Bf16Gemm::automatic;  // how bf16 GEMMs run (recipe_gemms.h)
};

// A CPU backend of its own: a run makes one, so that the scratch of its low-precision GEMMs is
// its own. (cpu_backend(), backend.h, is one shared with default options.)
std::unique_ptr<Backend> make_cpu_backend(CpuBackendOptions options = {});

}  // namespace moetron
