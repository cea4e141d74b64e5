// RecipeGemms (recipe_gemms.h): the GEMMs' operands quantized as the recipes do on the GPU, each
// GEMM then run in float32 by matmul.h (or, for bf16 on CPUs that have it, natively).
#include "moetron/kernels/cpu/recipe_gemms.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cpu/matmul.h"
#include "moetron/kernels/cpu/quantize.h"
#include "moetron/kernels/cpu/vector_isa.h"

namespace moetron::cpu {

namespace {

// DeepSeek-V3's tiles: 1 x 128 along the reduction dimension for activations and gradients,
// 128 x 128 for weights.
constexpr int64_t kDeepSeekTile = 128;

constexpr std::string_view kNativeBf16 = "native AVX512_BF16 (vdpbf16ps, float32 sums)";

// The environment's MOETRON_BF16_GEMM, if set: "native" or "emulated".
Bf16Gemm bf16_gemm_from_environment() {
    const char* value = std::getenv("MOETRON_BF16_GEMM");
    if (value == nullptr || *value == '\0') return Bf16Gemm::automatic;
    const std::string_view name(value);
    if (name == "native") return Bf16Gemm::native;
    if (name == "emulated") return Bf16Gemm::emulated;
    MT_USER_THROW("MOETRON_BF16_GEMM='{}' is not a choice; use native or emulated (or unset it)",
                  name);
}

void check_low_precision(GemmPrecision precision, const char* op) {
    MT_CHECK(precision.format != Precision::fp32, "[{}] float32 GEMMs run on matmul.h directly",
             op);
    require_engine_recipe(precision.format);
}

}  // namespace

RecipeGemms::RecipeGemms(Bf16Gemm bf16_gemm) {
    const bool from_environment = bf16_gemm == Bf16Gemm::automatic;
    if (from_environment) bf16_gemm = bf16_gemm_from_environment();
    // MOETRON_CPU_ISA=avx2 stands for a CPU without AVX-512 (vector_isa.h), which has no
    // vdpbf16ps either.
    const bool cpu_has_bf16 = cpu_has_avx512_bf16();
    const bool isa_hides_bf16 = cpu_has_bf16 && vector_isa() != VectorIsa::kAvx512;
    const bool cpu_native = cpu_has_bf16 && !isa_hides_bf16;
    switch (bf16_gemm) {
        case Bf16Gemm::automatic:
            native_bf16_ = cpu_native;
            bf16_gemm_reason_ = cpu_native
                                    ? std::string(kNativeBf16)
                                    : fmt::format(
                                          "emulated ({}): the float32 GEMM runs on the "
                                          "rounded values",
                                          isa_hides_bf16 ? "MOETRON_CPU_ISA=avx2 hides AVX512_BF16"
                                                         : "no AVX512_BF16");
            break;
        case Bf16Gemm::native:
            MT_USER_CHECK(cpu_native,
                          "the native bf16 GEMM needs a CPU with AVX512_BF16, which this one "
                          "{}{}",
                          isa_hides_bf16 ? "has but MOETRON_CPU_ISA=avx2 hides" : "lacks",
                          from_environment ? " (unset MOETRON_BF16_GEMM)" : "");
            native_bf16_ = true;
            bf16_gemm_reason_ = std::string(kNativeBf16);
            break;
        case Bf16Gemm::emulated:
            bf16_gemm_reason_ =
                fmt::format("emulated{}: the float32 GEMM runs on the rounded values",
                            from_environment ? " (MOETRON_BF16_GEMM=emulated)" : " (asked for)");
            break;
    }
}

std::string RecipeGemms::describe(Precision format) const {
    switch (format) {
        case Precision::fp32:
            return "float32";
        case Precision::bf16:
            return fmt::format("GEMM inputs rounded to bfloat16, float32 accumulation; bf16: {}",
                               bf16_gemm_reason_);
        case Precision::mxfp8:
            return "E4M3 in 32-element blocks with E8M0 scales (TE MXFP8), dequantized into the "
                   "float32 GEMM";
        case Precision::fp8_blockwise:
            return "E4M3 in 1x128 activation and 128x128 weight blocks (DeepSeek-V3), "
                   "dequantized into the float32 GEMM";
        case Precision::nvfp4:
            return "no NVFP4 kernel on the CPU backend (only the cluster model prices it)";
    }
    return "?";
}

float* RecipeGemms::slot_buffer(Slot slot, int64_t count) {
    std::vector<float>& buffer = copies_[slot];
    if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
    return buffer.data();
}

void RecipeGemms::fake_quantize(float* dst, const float* x, int64_t rows, int64_t cols,
                                bool reduction_along_rows, Role role, Precision format) {
    const int64_t n = rows * cols;
    if (n == 0) return;
    if (format == Precision::bf16) {
        round_to_bf16(dst, x, n);
        return;
    }
    if (static_cast<int64_t>(codes_.size()) < n) codes_.resize(static_cast<size_t>(n));
    if (format == Precision::mxfp8) {
        const bool down_columns = !reduction_along_rows;
        const int64_t num_scales = down_columns ? blocks_covering(rows, kMxfp8BlockSize) * cols
                                                : rows * blocks_covering(cols, kMxfp8BlockSize);
        if (static_cast<int64_t>(e8m0_scales_.size()) < num_scales)
            e8m0_scales_.resize(static_cast<size_t>(num_scales));
        quantize_mxfp8(codes_.data(), e8m0_scales_.data(), x, rows, cols, down_columns);
        dequantize_mxfp8(dst, codes_.data(), e8m0_scales_.data(), rows, cols, down_columns);
        return;
    }
    MT_CHECK(format == Precision::fp8_blockwise, "[recipe_gemms] no quantization for {}",
             precision_name(format));
    const bool weight = role == Role::weight;
    const int64_t block_rows = weight || !reduction_along_rows ? kDeepSeekTile : 1;
    const int64_t block_cols = weight || reduction_along_rows ? kDeepSeekTile : 1;
    const int64_t num_scales =
        blocks_covering(rows, block_rows) * blocks_covering(cols, block_cols);
    if (static_cast<int64_t>(float_scales_.size()) < num_scales)
        float_scales_.resize(static_cast<size_t>(num_scales));
    quantize_fp8_blocks(codes_.data(), float_scales_.data(), x, rows, cols, block_rows, block_cols);
    dequantize_fp8_blocks(dst, codes_.data(), float_scales_.data(), rows, cols, block_rows,
                          block_cols);
}

const float* RecipeGemms::fake_quantized(Slot slot, const float* x, int64_t rows, int64_t cols,
                                         bool reduction_along_rows, Role role, Precision format) {
    float* dst = slot_buffer(slot, rows * cols);
    fake_quantize(dst, x, rows, cols, reduction_along_rows, role, format);
    return dst;
}

const float* RecipeGemms::fake_quantized_experts(const float* weight, int64_t num_experts,
                                                 int64_t out_dim, int64_t in_dim,
                                                 bool reduction_along_rows, Precision format) {
    const int64_t per_expert = out_dim * in_dim;
    float* dst = slot_buffer(kSecond, num_experts * per_expert);
    for (int64_t e = 0; e < num_experts; ++e) {
        fake_quantize(dst + e * per_expert, weight + e * per_expert, out_dim, in_dim,
                      reduction_along_rows, Role::weight, format);
    }
    return dst;
}

// C = op(A) op(B): A (M, K) has its reduction along rows unless transposed; B (K, N) runs it down
// the columns unless transposed (then it is (N, K)).
void RecipeGemms::matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                         bool trans_a, bool trans_b, float beta, GemmPrecision precision) {
    check_low_precision(precision, "matmul");
    if (native(precision)) {
        bf16_matmul(bf16_workspace_, {c, a, b, m, n, k, trans_a, trans_b, beta});
        return;
    }
    const Precision f = precision.format;
    const float* qa = precision.input_quantized
                          ? a
                          : fake_quantized(kFirst, a, trans_a ? k : m, trans_a ? m : k, !trans_a,
                                           Role::activation, f);
    const float* qb =
        fake_quantized(kSecond, b, trans_b ? n : k, trans_b ? k : n, trans_b, Role::weight, f);
    cpu::matmul(c, qa, qb, m, n, k, trans_a, trans_b, beta);
}

void RecipeGemms::linear_forward(float* out, const float* inp, const float* weight,
                                 int64_t num_rows, int64_t in_dim, int64_t out_dim,
                                 GemmPrecision precision) {
    check_low_precision(precision, "linear_forward");
    if (native(precision)) {
        bf16_matmul(bf16_workspace_,
                    {out, inp, weight, num_rows, out_dim, in_dim, false, true, 0.0f});
        return;
    }
    const Precision f = precision.format;
    const float* x = precision.input_quantized
                         ? inp
                         : fake_quantized(kFirst, inp, num_rows, in_dim, true, Role::activation, f);
    const float* w = fake_quantized(kSecond, weight, out_dim, in_dim, true, Role::weight, f);
    cpu::linear_forward(out, x, w, num_rows, in_dim, out_dim);
}

void RecipeGemms::linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                  const float* weight, int64_t num_rows, int64_t in_dim,
                                  int64_t out_dim, GemmPrecision precision) {
    check_low_precision(precision, "linear_backward");
    if (native(precision)) {
        if (dinp != nullptr) {
            bf16_matmul(bf16_workspace_,
                        {dinp, dout, weight, num_rows, in_dim, out_dim, false, false, 0.0f});
        }
        if (dweight == nullptr) return;  // a split backward's B (split_backward_backend.h)
        bf16_matmul(bf16_workspace_,
                    {dweight, dout, inp, out_dim, in_dim, num_rows, true, false, 1.0f});
        return;
    }
    const Precision f = precision.format;
    // dinp (M, I) = dout (M, O) @ W (O, I): reduced over O, along dout's rows and down W's
    // columns (W's column-wise copy).
    if (dinp != nullptr) {
        const float* g = fake_quantized(kFirst, dout, num_rows, out_dim, true, Role::activation, f);
        const float* w = fake_quantized(kSecond, weight, out_dim, in_dim, false, Role::weight, f);
        cpu::matmul(dinp, g, w, num_rows, in_dim, out_dim, false, false, 0.0f);
    }
    // dW (O, I) += dout^T @ inp: reduced over the M tokens, down both operands' columns.
    if (dweight == nullptr) return;
    const float* g = fake_quantized(kFirst, dout, num_rows, out_dim, false, Role::activation, f);
    const float* x = fake_quantized(kSecond, inp, num_rows, in_dim, false, Role::activation, f);
    cpu::matmul(dweight, g, x, out_dim, in_dim, num_rows, true, false, 1.0f);
}

void RecipeGemms::grouped_linear_forward(float* out, const float* inp, const float* weight,
                                         const int64_t* offsets, int64_t num_experts,
                                         int64_t in_dim, int64_t out_dim, GemmPrecision precision) {
    check_low_precision(precision, "grouped_linear_forward");
    if (native(precision)) {
        // The kernel rounds its operands to bf16 as it packs them: a no-op on rows that arrived
        // as bf16, so quantized input takes the same kernel (the same sums).
        bf16_expert_gemms_.clear();
        for (int64_t e = 0; e < num_experts; ++e) {
            const int64_t row0 = offsets[e], rows = offsets[e + 1] - offsets[e];
            bf16_expert_gemms_.push_back({out + row0 * out_dim, inp + row0 * in_dim,
                                          weight + e * out_dim * in_dim, rows, out_dim, in_dim,
                                          false, true, 0.0f});
        }
        bf16_matmul_batch(bf16_workspace_, bf16_expert_gemms_.data(),
                          static_cast<int64_t>(bf16_expert_gemms_.size()));
        return;
    }
    const Precision f = precision.format;
    // Row-wise blocks lie within one token's row, so the whole input is quantized at once.
    const float* x = precision.input_quantized ? inp
                                               : fake_quantized(kFirst, inp, offsets[num_experts],
                                                                in_dim, true, Role::activation, f);
    const float* w = fake_quantized_experts(weight, num_experts, out_dim, in_dim, true, f);
    cpu::grouped_linear_forward(out, x, w, offsets, num_experts, in_dim, out_dim);
}

void RecipeGemms::grouped_linear_backward(float* dinp, float* dweight, const float* dout,
                                          const float* inp, const float* weight,
                                          const int64_t* offsets, int64_t num_experts,
                                          int64_t in_dim, int64_t out_dim,
                                          GemmPrecision precision) {
    check_low_precision(precision, "grouped_linear_backward");
    const int64_t per_expert = out_dim * in_dim;
    if (native(precision)) {
        // Both GEMMs of every expert in one batch (an expert's dinp and dW are independent).
        bf16_expert_gemms_.clear();
        for (int64_t e = 0; e < num_experts; ++e) {
            const int64_t row0 = offsets[e], rows = offsets[e + 1] - offsets[e];
            if (rows == 0) continue;  // its dweight gets += 0
            if (dinp != nullptr) {
                bf16_expert_gemms_.push_back({dinp + row0 * in_dim, dout + row0 * out_dim,
                                              weight + e * per_expert, rows, in_dim, out_dim, false,
                                              false, 0.0f});
            }
            if (dweight != nullptr) {  // null in a split backward's B
                bf16_expert_gemms_.push_back({dweight + e * per_expert, dout + row0 * out_dim,
                                              inp + row0 * in_dim, out_dim, in_dim, rows, true,
                                              false, 1.0f});
            }
        }
        bf16_matmul_batch(bf16_workspace_, bf16_expert_gemms_.data(),
                          static_cast<int64_t>(bf16_expert_gemms_.size()));
        return;
    }
    const Precision f = precision.format;
    if (dinp != nullptr) {
        const float* g =
            fake_quantized(kFirst, dout, offsets[num_experts], out_dim, true, Role::activation, f);
        const float* w = fake_quantized_experts(weight, num_experts, out_dim, in_dim, false, f);
        for (int64_t e = 0; e < num_experts; ++e) {
            const int64_t row0 = offsets[e], rows = offsets[e + 1] - offsets[e];
            if (rows == 0) continue;
            cpu::matmul(dinp + row0 * in_dim, g + row0 * out_dim, w + e * per_expert, rows, in_dim,
                        out_dim, false, false, 0.0f);
        }
    }
    // Column-wise blocks run down one expert's tokens: each segment is quantized on its own.
    for (int64_t e = 0; dweight != nullptr && e < num_experts; ++e) {
        const int64_t row0 = offsets[e], rows = offsets[e + 1] - offsets[e];
        if (rows == 0) continue;
        const float* g = fake_quantized(kFirst, dout + row0 * out_dim, rows, out_dim, false,
                                        Role::activation, f);
        const float* x =
            fake_quantized(kSecond, inp + row0 * in_dim, rows, in_dim, false, Role::activation, f);
        cpu::matmul(dweight + e * per_expert, g, x, out_dim, in_dim, rows, true, false, 1.0f);
    }
}

}  // namespace moetron::cpu
