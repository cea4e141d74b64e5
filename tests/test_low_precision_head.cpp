// Which format each GEMM of a training step runs in under each recipe (model/compute.h), as the
// model passes it on the call: the output head's in bfloat16 under the bf16 recipe (as
// Megatron-LM's --bf16 runs the output layer) and in float32 under the FP8 recipes (as
// DeepSeek-V3 keeps it), the router's in float32 under every recipe, the layers' and experts' in
// the recipe's format; and under a split backward (zb-h1) the head's and router's backwards stay
// whole, on the backend below the split.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/kernels/forwarding_backend.h"
#include "moetron/kernels/split_backward_backend.h"
#include "moetron/model/model.h"
#include "tiny_model_config.h"

namespace moetron {
namespace {

using testing::tiny_model_config;

// The CPU backend, remembering the formats each weight's GEMMs were called with.
class GemmFormatRecorder final : public ForwardingBackend {
  public:
    GemmFormatRecorder() : ForwardingBackend(cpu_backend()) {}

    std::set<Precision> formats(const float* weight) const {
        const auto it = formats_.find(weight);
        return it == formats_.end() ? std::set<Precision>{} : it->second;
    }
    // Whether a forward GEMM of this weight took its input as already quantized.
    bool input_quantized(const float* weight) const { return input_quantized_.count(weight) > 0; }
    // Weight gradients computed into dweight.
    int64_t weight_gradients(const float* dweight) const {
        const auto it = weight_gradients_.find(dweight);
        return it == weight_gradients_.end() ? 0 : it->second;
    }

    void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta, GemmPrecision precision) override {
        formats_[b].insert(precision.format);  // B is the weight (every caller's convention)
        inner().matmul(c, a, b, m, n, k, trans_a, trans_b, beta, precision);
    }
    void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                        int64_t in_dim, int64_t out_dim, GemmPrecision precision) override {
        formats_[weight].insert(precision.format);
        inner().linear_forward(out, inp, weight, num_rows, in_dim, out_dim, precision);
    }
    void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int64_t num_rows, int64_t in_dim, int64_t out_dim,
                         GemmPrecision precision) override {
        if (weight != nullptr) formats_[weight].insert(precision.format);  // null in a split's W
        if (dweight != nullptr) weight_gradients_[dweight] += 1;
        inner().linear_backward(dinp, dweight, dout, inp, weight, num_rows, in_dim, out_dim,
                                precision);
    }
    void grouped_linear_forward(float* out, const float* inp, const float* weight,
                                const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                int64_t out_dim, GemmPrecision precision) override {
        formats_[weight].insert(precision.format);
        if (precision.input_quantized) input_quantized_.insert(weight);
        inner().grouped_linear_forward(out, inp, weight, offsets, num_experts, in_dim, out_dim,
                                       precision);
    }

  private:
    std::map<const float*, std::set<Precision>> formats_;
    std::map<const float*, int64_t> weight_gradients_;
    std::set<const float*> input_quantized_;
};

const ParamEntry* entry(Model& model, const std::string& name) {
    for (const ParamEntry& e : model.param_entries()) {
        if (e.name == name) return &e;
    }
    ADD_FAILURE() << "no parameter " << name;
    return nullptr;
}
const float* param(Model& model, const std::string& name) {
    const ParamEntry* e = entry(model, name);
    return e == nullptr ? nullptr : model.params() + e->offset;
}
const float* grad(Model& model, const std::string& name) {
    const ParamEntry* e = entry(model, name);
    return e == nullptr ? nullptr : model.grads() + e->offset;
}

constexpr int64_t kBatch = 2, kSeqLen = 16;

void one_step(Model& model) {
    model.init_parameters(7);
    std::vector<int32_t> tokens, targets;
    for (int64_t i = 0; i < kBatch * kSeqLen; ++i) {
        tokens.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
        targets.push_back(static_cast<int32_t>((i * 53 + 5) % 256));
    }
    model.forward_backward(tokens.data(), targets.data(), kBatch, kSeqLen, 1.0f);
}

struct Formats {
    std::set<Precision> head, router, attention, experts;
};

// One training step of the tiny model (with MTP) under `precision`.
Formats formats_in_a_step(Precision precision) {
    GemmFormatRecorder recorder;
    ModelRuntime runtime{kBatch, kSeqLen, &recorder};
    runtime.precision = precision;
    Model model(tiny_model_config(), runtime, LossWeights{});
    one_step(model);
    return {recorder.formats(param(model, "head")),
            recorder.formats(param(model, "layers.1.mlp.router")),
            recorder.formats(param(model, "layers.0.attn.o_proj")),
            recorder.formats(param(model, "layers.1.mlp.experts.down"))};
}

TEST(LowPrecisionHead, Bf16RunsTheOutputHeadInBf16ButNotTheRouter) {
    const Formats f = formats_in_a_step(Precision::bf16);
    EXPECT_EQ(f.attention, std::set<Precision>{Precision::bf16});
    EXPECT_EQ(f.experts, std::set<Precision>{Precision::bf16});
    EXPECT_EQ(f.head, std::set<Precision>{Precision::bf16});
    EXPECT_EQ(f.router, std::set<Precision>{Precision::fp32});
}

TEST(LowPrecisionHead, Fp8RecipesKeepTheOutputHeadAndTheRouterInFloat32) {
    for (const Precision precision : {Precision::mxfp8, Precision::fp8_blockwise}) {
        SCOPED_TRACE(std::string(precision_name(precision)));
        const Formats f = formats_in_a_step(precision);
        EXPECT_EQ(f.attention, std::set<Precision>{precision});
        EXPECT_EQ(f.experts, std::set<Precision>{precision});
        EXPECT_EQ(f.head, std::set<Precision>{Precision::fp32});
        EXPECT_EQ(f.router, std::set<Precision>{Precision::fp32});
    }
}

TEST(LowPrecisionHead, Fp32RunsEveryGemmInFloat32) {
    const Formats f = formats_in_a_step(Precision::fp32);
    for (const auto* formats : {&f.attention, &f.experts, &f.head, &f.router})
        EXPECT_EQ(*formats, std::set<Precision>{Precision::fp32});
}

// Under a split backward the model's ops go through the split, but the head's and the router's
// backwards run on the backend below it (ModelRuntime::whole_backward), never queued.
TEST(LowPrecisionHead, HeadAndRouterBackwardsStayWholeUnderASplitBackward) {
    GemmFormatRecorder below;
    SplitBackwardBackend split(below);
    ModelRuntime runtime{kBatch, kSeqLen, &split};
    runtime.whole_backward = &below;
    runtime.precision = Precision::bf16;
    Model model(tiny_model_config(), runtime, LossWeights{});
    split.plan_stash(1, 1 << 20, 64, 256);
    split.defer_into(0);
    one_step(model);
    split.stop_deferring();
    // Before W: the head's and the router's weight gradients are computed; a layer's waits.
    EXPECT_GT(below.weight_gradients(grad(model, "head")), 0);
    EXPECT_GT(below.weight_gradients(grad(model, "layers.1.mlp.router")), 0);
    EXPECT_EQ(below.weight_gradients(grad(model, "layers.0.attn.o_proj")), 0)
        << "the layer's weight gradient ran in B";
    const int64_t head_before_w = below.weight_gradients(grad(model, "head"));
    split.run_deferred(0);
    EXPECT_GT(below.weight_gradients(grad(model, "layers.0.attn.o_proj")), 0)
        << "the layer's weight gradient never ran";
    EXPECT_EQ(below.weight_gradients(grad(model, "head")), head_before_w)
        << "the head's weight gradient was queued";
}

// A model cannot be built for a recipe the engine lacks, nor its dispatcher for such a payload.
TEST(LowPrecisionHead, AModelRefusesARecipeTheEngineLacks) {
    ModelRuntime runtime{kBatch, kSeqLen};
    runtime.precision = Precision::nvfp4;
    try {
        Model model(tiny_model_config(), runtime, LossWeights{});
        ADD_FAILURE() << "an nvfp4 model was built";
    } catch (const UserError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "the engine has no NVFP4 recipe yet; simulate and plan price it");
    }
    ModelParallel parallel;
    parallel.moe.token_format = Precision::nvfp4;
    runtime.precision = Precision::fp32;
    EXPECT_THROW(Model(tiny_model_config(), runtime, LossWeights{}, parallel), UserError);
}

// Tokens that travel in the recipe's format reach the experts' first GEMM as they arrived, not
// quantized again: under a split backward too (the format travels with the calls; it used to be
// inferred from the backend's type, which a split backward hid).
TEST(LowPrecisionHead, ArrivedTokensAreNotQuantizedAgainUnderASplitBackward) {
    for (const Precision token_format : {Precision::mxfp8, Precision::fp32}) {
        SCOPED_TRACE(std::string(precision_name(token_format)));
        GemmFormatRecorder below;
        SplitBackwardBackend split(below);
        ModelRuntime runtime{kBatch, kSeqLen, &split};
        runtime.whole_backward = &below;
        runtime.precision = Precision::mxfp8;
        ModelParallel parallel;
        parallel.moe.token_format = token_format;
        Model model(tiny_model_config(), runtime, LossWeights{}, parallel);
        one_step(model);
        EXPECT_EQ(below.input_quantized(param(model, "layers.1.mlp.experts.gate_up")),
                  token_format == Precision::mxfp8);
        EXPECT_FALSE(below.input_quantized(param(model, "layers.1.mlp.experts.down")));
    }
}

}  // namespace
}  // namespace moetron
