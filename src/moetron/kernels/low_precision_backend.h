// Low-precision training on any Backend: LowPrecisionBackend decorates one, forwards every op
// unchanged except the GEMMs, whose inputs it first quantizes as the GPU recipe would (FP8
// blocks along each GEMM's reduction dimension, or bfloat16) and dequantizes back to float32,
// then runs the inner backend's float32 GEMM on those values. The arithmetic is therefore the
// recipe's (products of the quantized values, accumulated in float32: at least the precision the
// recipes accumulate in); only the speed is not. Master weights, gradients and optimizer state
// stay float32.
//
// Which tensor is quantized how (README "Low precision" gives the sources):
//   bf16           every GEMM input rounded to bfloat16 (nearest even); on CPUs with AVX512_BF16
//                  the GEMM itself runs in bfloat16 (cpu/bf16_gemm.h: rounded while packed,
//                  products summed in float32 by vdpbf16ps), equal to the emulation up to the
//                  order of the float32 additions
//   mxfp8          E4M3 in 1 x 32 blocks along the reduction dimension, E8M0 scales (TE's
//                  MXFP8BlockScaling): row-wise copies for the forward and the input gradient,
//                  column-wise copies (32 x 1) of the output gradient and the input for the weight
//                  gradient, of the weight for the input gradient
//   fp8-blockwise  DeepSeek-V3: activations and gradients in 1 x 128 tiles along the reduction
//                  dimension (128 x 1 where it runs down the columns), weights in 128 x 128 blocks
// The decorator quantizes every GEMM it is given; the parts a recipe keeps in high precision call
// high_precision(ops) instead: the router under every recipe (DeepSeek-V3 keeps its gating in
// high precision), the output head under the FP8 recipes only (output_head_backend(ops): the
// bf16 recipe runs every GEMM in bfloat16, the output layer included, as Megatron-LM's --bf16
// does; DeepSeek-V3's FP8 recipe keeps the head in its higher precision). In matmul(), B is the
// weight (every caller's convention); linear and grouped linear name their weight.
//
// Scratch: the dequantized copies and codes live in buffers that grow to the largest GEMM of the
// first step and are reused after it (allocation only while they grow).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/kernels/cpu/bf16_gemm.h"
#include "moetron/kernels/forwarding_backend.h"

namespace moetron {

enum class Precision : uint8_t { fp32, bf16, mxfp8, fp8_blockwise };

// "fp32", "bf16", "mxfp8", "fp8-blockwise"; anything else is a user error naming the choices.
Precision parse_precision(std::string_view name);
std::string_view precision_name(Precision precision);

// How the bf16 recipe's GEMMs run. automatic: native where the CPU has AVX512_BF16 (and
// MOETRON_CPU_ISA=avx2 does not make it stand for an AVX2-only CPU), unless the
// environment variable MOETRON_BF16_GEMM says "emulated" (or "native"), so that both can be
// measured on one machine; native: vdpbf16ps (a user error on a CPU without AVX512_BF16);
// emulated: inputs rounded to bfloat16, then the inner backend's float32 GEMM.
enum class Bf16Gemm : uint8_t { automatic, native, emulated };

class LowPrecisionBackend final : public ForwardingBackend {
  public:
    // precision must not be fp32 (use the inner backend itself); inner must compute on the host.
    LowPrecisionBackend(Backend& inner, Precision precision,
                        Bf16Gemm bf16_gemm = Bf16Gemm::automatic);

    Precision precision() const { return precision_; }
    // True when the bf16 recipe runs its GEMMs on the AVX512_BF16 kernel.
    bool native_bf16() const { return native_bf16_; }

    // The inner backend's line plus how the recipe runs here.
    std::string describe() const override;

    void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta) override;
    void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                        int64_t in_dim, int64_t out_dim) override;
    void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int64_t num_rows, int64_t in_dim,
                         int64_t out_dim) override;
    void grouped_linear_forward(float* out, const float* inp, const float* weight,
                                const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                int64_t out_dim) override;
    void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const int64_t* offsets, int64_t num_experts,
                                 int64_t in_dim, int64_t out_dim) override;
    // grouped_linear_forward on an input that already holds this recipe's row-wise quantized
    // values (the expert dispatch carried the tokens in that format, parallel/dispatch_payload.h):
    // only the weight is quantized; the input is used as it arrived.
    void grouped_linear_forward_quantized_input(float* out, const float* inp, const float* weight,
                                                const int64_t* offsets, int64_t num_experts,
                                                int64_t in_dim, int64_t out_dim);

  private:
    enum class Role : uint8_t { activation, weight };
    // Which operand's copy a buffer holds: the two inputs of one GEMM at a time.
    enum Slot : uint8_t { kFirst = 0, kSecond = 1 };

    // The recipe's quantize-dequantize of x (rows, cols) into `dst`, blocks running along the rows
    // (reduction dimension contiguous) or down the columns.
    void fake_quantize(float* dst, const float* x, int64_t rows, int64_t cols,
                       bool reduction_along_rows, Role role);
    // The same into slot's buffer, grown to fit.
    const float* fake_quantized(Slot slot, const float* x, int64_t rows, int64_t cols,
                                bool reduction_along_rows, Role role);
    float* slot_buffer(Slot slot, int64_t count);
    // The GEMMs on the AVX512_BF16 kernel (native_bf16_ only): one, or the experts' batch
    // (bf16_expert_gemms_, filled by the caller).
    void native_bf16_matmul(const cpu::Bf16Matmul& gemm);
    void native_bf16_expert_gemms();
    // A grouped weight (E, O, I), expert by expert (blocks never span two experts).
    const float* fake_quantized_experts(const float* weight, int64_t num_experts, int64_t out_dim,
                                        int64_t in_dim, bool reduction_along_rows);

    Precision precision_;
    bool native_bf16_ = false;
    // Why the bf16 GEMMs run as they do, for describe().
    std::string bf16_gemm_reason_;
    cpu::Bf16GemmWorkspace bf16_workspace_;
    std::vector<cpu::Bf16Matmul> bf16_expert_gemms_;
    std::vector<float> copies_[2];
    std::vector<uint8_t> codes_;
    std::vector<uint8_t> e8m0_scales_;
    std::vector<float> float_scales_;
};

// The backend for the GEMMs a recipe keeps in high precision: the inner backend of the
// LowPrecisionBackend in ops's stack (seen through a SplitBackwardBackend, whose GEMMs here stay
// whole, and a ProfilingBackend, whose timing these GEMMs then miss), else ops itself.
Backend& high_precision(Backend& ops);

// The backend for the output head's GEMMs: ops itself under the bf16 recipe (but never split by
// a SplitBackwardBackend), high_precision(ops) under the FP8 recipes and in float32.
Backend& output_head_backend(Backend& ops);

}  // namespace moetron
