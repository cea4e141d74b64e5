// The CPU's GEMMs in the recipes' low-precision formats (GemmPrecision, kernels/op_types.h): each
// operand quantized as the GPU recipe would (FP8 blocks along each GEMM's reduction dimension, or
// bfloat16) and dequantized back to float32, then the float32 GEMM of matmul.h on those values.
// The arithmetic is therefore the recipe's (products of the quantized values, accumulated in
// float32: at least the precision the recipes accumulate in); only the speed is not. Master
// weights, gradients and optimizer state stay float32 (the caller's).
//
// Which tensor is quantized how (docs/low-precision.md gives the sources):
//   bf16           every GEMM input rounded to bfloat16 (nearest even); on CPUs with AVX512_BF16
//                  the GEMM itself runs in bfloat16 (bf16_gemm.h: rounded while packed, products
//                  summed in float32 by vdpbf16ps), equal to the emulation up to the order of
//                  the float32 additions
//   mxfp8          E4M3 in 1 x 32 blocks along the reduction dimension, E8M0 scales (TE's
//                  MXFP8BlockScaling): row-wise copies for the forward and the input gradient,
//                  column-wise copies (32 x 1) of the output gradient and the input for the weight
//                  gradient, of the weight for the input gradient
//   fp8-blockwise  DeepSeek-V3: activations and gradients in 1 x 128 tiles along the reduction
//                  dimension (128 x 1 where it runs down the columns), weights in 128 x 128 blocks
// In matmul(), B is the weight (every caller's convention); linear and grouped linear name theirs.
//
// Scratch: the dequantized copies and codes live in buffers that grow to the largest GEMM of the
// first step and are reused after it (allocation only while they grow). One call at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/kernels/cpu/bf16_gemm.h"
#include "moetron/kernels/op_types.h"

namespace moetron::cpu {

// How the bf16 format's GEMMs run. automatic: native where the CPU has AVX512_BF16 (and
// MOETRON_CPU_ISA=avx2 does not make it stand for an AVX2-only CPU), unless the environment
// variable MOETRON_BF16_GEMM says "emulated" (or "native"), so that both can be measured on one
// machine; native: vdpbf16ps (a user error on a CPU without AVX512_BF16); emulated: inputs
// rounded to bfloat16, then the float32 GEMM.
enum class Bf16Gemm : uint8_t { automatic, native, emulated };

class RecipeGemms {
  public:
    explicit RecipeGemms(Bf16Gemm bf16_gemm = Bf16Gemm::automatic);

    // True when the bf16 format's GEMMs run on the AVX512_BF16 kernel.
    bool native_bf16() const { return native_bf16_; }
    // How GEMMs in `format` run here, for a run's header.
    std::string describe(Precision format) const;

    // The GEMMs of matmul.h in a low-precision format (precision.format is not fp32).
    void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta, GemmPrecision precision);
    void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                        int64_t in_dim, int64_t out_dim, GemmPrecision precision);
    void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int64_t num_rows, int64_t in_dim, int64_t out_dim,
                         GemmPrecision precision);
    void grouped_linear_forward(float* out, const float* inp, const float* weight,
                                const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                int64_t out_dim, GemmPrecision precision);
    void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const int64_t* offsets, int64_t num_experts,
                                 int64_t in_dim, int64_t out_dim, GemmPrecision precision);

  private:
    enum class Role : uint8_t { activation, weight };
    // Which operand's copy a buffer holds: the two inputs of one GEMM at a time.
    enum Slot : uint8_t { kFirst = 0, kSecond = 1 };

    // Whether this call runs on the native bf16 kernel.
    bool native(GemmPrecision precision) const {
        return native_bf16_ && precision.format == Precision::bf16;
    }
    // The format's quantize-dequantize of x (rows, cols) into `dst`, blocks running along the
    // rows (reduction dimension contiguous) or down the columns.
    void fake_quantize(float* dst, const float* x, int64_t rows, int64_t cols,
                       bool reduction_along_rows, Role role, Precision format);
    // The same into slot's buffer, grown to fit.
    const float* fake_quantized(Slot slot, const float* x, int64_t rows, int64_t cols,
                                bool reduction_along_rows, Role role, Precision format);
    float* slot_buffer(Slot slot, int64_t count);
    // A grouped weight (E, O, I), expert by expert (blocks never span two experts).
    const float* fake_quantized_experts(const float* weight, int64_t num_experts, int64_t out_dim,
                                        int64_t in_dim, bool reduction_along_rows,
                                        Precision format);

    bool native_bf16_ = false;
    // Why the bf16 GEMMs run as they do, for describe().
    std::string bf16_gemm_reason_;
    Bf16GemmWorkspace bf16_workspace_;
    std::vector<Bf16Matmul> bf16_expert_gemms_;
    std::vector<float> copies_[2];
    std::vector<uint8_t> codes_;
    std::vector<uint8_t> e8m0_scales_;
    std::vector<float> float_scales_;
};

}  // namespace moetron::cpu
