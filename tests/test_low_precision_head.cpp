// Which GEMMs of a training step each low-precision recipe quantizes (low_precision_backend.h):
// the output head's in bfloat16 under the bf16 recipe (as Megatron-LM's --bf16 runs the output
// layer) and in float32 under the FP8 recipes (as DeepSeek-V3 keeps it), the router's in float32
// under every recipe; and the backends high_precision and output_head_backend pick through the
// decorators that may sit above the recipe (a profiler, a split backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "moetron/kernels/forwarding_backend.h"
#include "moetron/kernels/low_precision_backend.h"
#include "moetron/kernels/profiling_backend.h"
#include "moetron/kernels/split_backward_backend.h"
#include "moetron/model/model.h"
#include "tiny_model_config.h"

namespace moetron {
namespace {

using testing::tiny_model_config;

// The CPU backend, remembering the start of every tensor the recipe above it quantized.
class QuantizedTensorRecorder final : public ForwardingBackend {
  public:
    QuantizedTensorRecorder() : ForwardingBackend(cpu_backend()) {}

    bool quantized(const float* x) const {
        return std::find(sources_.begin(), sources_.end(), x) != sources_.end();
    }

    void round_to_bf16(float* out, const float* x, int64_t n) override {
        sources_.push_back(x);
        inner().round_to_bf16(out, x, n);
    }
    void quantize_mxfp8(uint8_t* elements, uint8_t* scales, const float* x, int64_t rows,
                        int64_t cols, bool down_columns) override {
        sources_.push_back(x);
        inner().quantize_mxfp8(elements, scales, x, rows, cols, down_columns);
    }
    void quantize_fp8_blocks(uint8_t* elements, float* scales, const float* x, int64_t rows,
                             int64_t cols, int64_t block_rows, int64_t block_cols) override {
        sources_.push_back(x);
        inner().quantize_fp8_blocks(elements, scales, x, rows, cols, block_rows, block_cols);
    }

  private:
    std::vector<const float*> sources_;
};

const float* param(Model& model, const std::string& name) {
    for (const ParamEntry& e : model.param_entries()) {
        if (e.name == name) return model.params() + e.offset;
    }
    ADD_FAILURE() << "no parameter " << name;
    return nullptr;
}

struct QuantizedWeights {
    bool head = false, router = false, attention = false;
};

// One training step of the tiny model (with MTP) under `precision`, its bf16 GEMMs emulated so
// that the recorder sees what they round.
QuantizedWeights quantized_in_a_step(Precision precision) {
    constexpr int64_t batch = 2, seq_len = 16;
    QuantizedTensorRecorder recorder;
    LowPrecisionBackend low(recorder, precision, Bf16Gemm::emulated);
    Model model(tiny_model_config(), ModelRuntime{batch, seq_len, &low}, LossWeights{});
    model.init_parameters(7);
    std::vector<int32_t> tokens, targets;
    for (int64_t i = 0; i < batch * seq_len; ++i) {
        tokens.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
        targets.push_back(static_cast<int32_t>((i * 53 + 5) % 256));
    }
    model.forward_backward(tokens.data(), targets.data(), batch, seq_len, 1.0f);
    return {recorder.quantized(param(model, "head")),
            recorder.quantized(param(model, "layers.1.mlp.router")),
            recorder.quantized(param(model, "layers.0.attn.o_proj"))};
}

TEST(LowPrecisionHead, Bf16RoundsTheOutputHeadButNotTheRouter) {
    const QuantizedWeights q = quantized_in_a_step(Precision::bf16);
    EXPECT_TRUE(q.attention);
    EXPECT_TRUE(q.head);
    EXPECT_FALSE(q.router);
}

TEST(LowPrecisionHead, Fp8RecipesKeepTheOutputHeadAndTheRouterInFloat32) {
    for (const Precision precision : {Precision::mxfp8, Precision::fp8_blockwise}) {
        SCOPED_TRACE(std::string(precision_name(precision)));
        const QuantizedWeights q = quantized_in_a_step(precision);
        EXPECT_TRUE(q.attention);
        EXPECT_FALSE(q.head);
        EXPECT_FALSE(q.router);
    }
}

TEST(LowPrecisionHead, BackendsAreFoundThroughAProfilerAndASplitBackward) {
    LowPrecisionBackend bf16(cpu_backend(), Precision::bf16, Bf16Gemm::emulated);
    LowPrecisionBackend mxfp8(cpu_backend(), Precision::mxfp8);
    ProfilingBackend profiled_bf16(bf16), profiled_mxfp8(mxfp8);
    SplitBackwardBackend split_bf16(bf16);

    EXPECT_EQ(&high_precision(profiled_bf16), &cpu_backend());
    EXPECT_EQ(&high_precision(profiled_mxfp8), &cpu_backend());
    EXPECT_EQ(&output_head_backend(bf16), &bf16);
    EXPECT_EQ(&output_head_backend(profiled_bf16), &profiled_bf16);
    EXPECT_EQ(&output_head_backend(split_bf16), &bf16);  // whole, not split
    EXPECT_EQ(&output_head_backend(mxfp8), &cpu_backend());
    EXPECT_EQ(&output_head_backend(profiled_mxfp8), &cpu_backend());
    EXPECT_EQ(&output_head_backend(cpu_backend()), &cpu_backend());
}

}  // namespace
}  // namespace moetron
