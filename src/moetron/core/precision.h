// The training recipes' number formats: the one vocabulary of --precision for every command (train,
// bench, info, simulate, plan), the format a GEMM runs in (kernels/op_types.h's GemmPrecision) and
// the format a dispatched token travels in (parallel/dispatch_payload.h).
//   fp32           single precision throughout
//   bf16           GEMM inputs rounded to bfloat16 (nearest even), float32 accumulation
//   mxfp8          E4M3 elements in 1 x 32 blocks along the reduction dimension, E8M0 scales
//                  (Transformer Engine's MXFP8BlockScaling)
//   fp8-blockwise  DeepSeek-V3's FP8: E4M3 in 1 x 128 tiles for activations and gradients, 128 x
//                  128 blocks for weights, float32 scales
//   nvfp4          E2M1 elements in 1 x 16 blocks with E4M3 scales (Transformer Engine's
//                  NVFP4BlockScaling): only the cluster model prices it (simulate, plan); the
//                  engine refuses it (require_engine_recipe)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moetron {

enum class Precision : uint8_t { fp32, bf16, mxfp8, fp8_blockwise, nvfp4 };
inline constexpr size_t kNumPrecisions = static_cast<size_t>(Precision::nvfp4) + 1;

// "fp32", "bf16", "mxfp8", "fp8-blockwise", "nvfp4"; anything else is a user error naming the
// choices, and an old spelling (the cluster model's "fp8" and "fp4") one naming its new one.
Precision parse_precision(std::string_view name);
std::string_view precision_name(Precision precision);

// Whether the engine can train with `recipe`: every recipe but nvfp4, which has no kernels,
// quantizer or dispatch payload here yet.
bool engine_has_recipe(Precision recipe);
// Throws a user error for a recipe the engine cannot train with ("the engine has no NVFP4 recipe
// yet; simulate and plan price it"); every engine path that takes a recipe checks it.
void require_engine_recipe(Precision recipe);

}  // namespace moetron
