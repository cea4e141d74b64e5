// The model against Hugging Face transformers' DeepseekV3ForCausalLM (an independent PyTorch
// implementation): tests/data/tiny_reference.bin holds its weights, inputs, targets, logits,
// loss, routing and every gradient for the tiny preset (tools/reference/make_reference.py).
// The weights go in through the HF name map; with MTP and the balance loss off (HF has neither),
// logits, loss, routing and every gradient must agree to float32 accuracy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "moetron/model/hf_names.h"
#include "moetron/model/model.h"
#include "reference_file.h"
#include "testing.h"

namespace moetron {
namespace {

const std::string kReferencePath =
    std::string(MOETRON_SOURCE_DIR) + "/tests/data/tiny_reference.bin";

// The model config the dump was made with, from its "config.*" scalars.
ModelConfig config_from_reference(const testing::ReferenceFile& ref) {
    auto i = [&](const char* key) {
        return static_cast<int64_t>(ref.scalar(std::string("config.") + key));
    };
    auto f = [&](const char* key) { return ref.scalar(std::string("config.") + key); };
    ModelConfig c;
    c.name = "tiny-reference";
    c.vocab_size = i("vocab_size");
    c.hidden_size = i("hidden_size");
    c.num_hidden_layers = i("num_hidden_layers");
    c.first_k_dense_replace = i("first_k_dense_replace");
    c.moe_layer_freq = i("moe_layer_freq");
    c.intermediate_size = i("intermediate_size");
    c.moe_intermediate_size = i("moe_intermediate_size");
    c.n_routed_experts = i("n_routed_experts");
    c.n_shared_experts = i("n_shared_experts");
    c.num_experts_per_tok = i("num_experts_per_tok");
    c.n_group = i("n_group");
    c.topk_group = i("topk_group");
    c.num_attention_heads = i("num_attention_heads");
    c.q_lora_rank = i("q_lora_rank");
    c.kv_lora_rank = i("kv_lora_rank");
    c.qk_nope_head_dim = i("qk_nope_head_dim");
    c.qk_rope_head_dim = i("qk_rope_head_dim");
    c.v_head_dim = i("v_head_dim");
    c.max_position_embeddings = i("max_position_embeddings");
    c.routed_scaling_factor = f("routed_scaling_factor");
    c.rope_theta = f("rope_theta");
    c.rms_norm_eps = f("rms_norm_eps");
    c.initializer_range = f("initializer_range");
    c.norm_topk_prob = f("norm_topk_prob") != 0.0;
    c.tie_word_embeddings = f("tie_word_embeddings") != 0.0;
    c.num_nextn_predict_layers = 0;  // Hugging Face's model has no MTP module
    return c;
}

class ModelReference : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!std::filesystem::exists(kReferencePath)) {
            GTEST_SKIP() << kReferencePath
                         << " is missing; generate it with tools/reference/make_reference.py";
        }
        ref_ = testing::ReferenceFile::load(kReferencePath);
        config_ = config_from_reference(ref_);
        const std::vector<int64_t>& shape = ref_.get("inputs").shape;
        ASSERT_EQ(shape.size(), 2u);
        batch_ = shape[0];
        seq_len_ = shape[1];
        model_ = std::make_unique<Model>(config_, ModelRuntime{batch_, seq_len_},
                                         LossWeights{0.0f, 0.0f});
        // Every moetron parameter must come from the file: start from NaN so a gap shows.
        std::fill(model_->params(), model_->params() + model_->num_params(), NAN);
        const HfNameMap map(config_, HfExpertLayout::fused);
        for (const HfTensor& t : map.tensors()) {
            const std::vector<int64_t> shape_vec(t.hf_shape.dims.begin(),
                                                 t.hf_shape.dims.begin() + t.hf_shape.ndim);
            copy_hf_to_param(model_->param(t.param_name).f32(), t,
                             ref_.get(t.hf_name, shape_vec).f32.data());
            ++num_loaded_;
        }
    }

    testing::ReferenceFile ref_;
    ModelConfig config_;
    int64_t batch_ = 0, seq_len_ = 0;
    std::unique_ptr<Model> model_;
    int num_loaded_ = 0;
};

TEST_F(ModelReference, LogitsLossAndRoutingMatch) {
    for (int64_t i = 0; i < model_->num_params(); ++i)
        ASSERT_FALSE(std::isnan(model_->params()[i])) << "parameter element " << i << " not loaded";
    const std::vector<int32_t>& inputs = ref_.get("inputs").i32;
    const std::vector<int32_t>& targets = ref_.get("targets").i32;
    const MicroBatchLosses losses =
        model_->forward(inputs.data(), targets.data(), batch_, seq_len_);

    const int64_t n = batch_ * seq_len_, V = config_.vocab_size;
    const testing::ReferenceTensor& logits = ref_.get("logits", {batch_, seq_len_, V});
    testing::expect_close(
        "model_reference", "logits",
        testing::compare(model_->logits(), logits.f32.data(), static_cast<size_t>(n * V), 1e-2),
        1e-4);
    const double ref_loss = ref_.get("loss").f32[0];
    const double loss_rel = std::fabs(losses.lm_loss - ref_loss) / ref_loss;
    std::printf("[maxerr] model_reference loss rel=%.3e (ours %.7f, PyTorch %.7f)\n", loss_rel,
                losses.lm_loss, ref_loss);
    EXPECT_LE(loss_rel, 1e-5);

    // Routing: the same experts for every token of every MoE layer (the dump's routing is clear
    // of ties by meta.min_routing_margin), and the same gating weights.
    const std::vector<int32_t> ours = model_->last_routing();
    const int64_t K = config_.num_experts_per_tok;
    int64_t slot = 0;
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
        if (!config_.is_moe_layer(l)) continue;
        const std::string prefix = "route.layers." + std::to_string(l);
        const std::vector<int32_t>& ref_ids = ref_.get(prefix + ".topk_indices", {n, K}).i32;
        for (int64_t t = 0; t < n; ++t) {
            std::vector<int32_t> row(ours.begin() + (slot * n + t) * K,
                                     ours.begin() + (slot * n + t + 1) * K);
            std::sort(row.begin(), row.end());  // the dump stores each row by expert id
            EXPECT_TRUE(std::equal(row.begin(), row.end(), ref_ids.begin() + t * K))
                << "layer " << l << " token " << t;
        }
        ++slot;
    }
    EXPECT_EQ(slot * n * K, static_cast<int64_t>(ours.size()));
}

TEST_F(ModelReference, EveryGradientMatches) {
    const std::vector<int32_t>& inputs = ref_.get("inputs").i32;
    const std::vector<int32_t>& targets = ref_.get("targets").i32;
    model_->zero_grads();
    model_->forward_backward(inputs.data(), targets.data(), batch_, seq_len_, 1.0f);

    const HfNameMap map(config_, HfExpertLayout::fused);
    double worst_rel = 0;
    std::string worst;
    int compared = 0;
    std::vector<float> ours;
    for (const HfTensor& t : map.tensors()) {
        const ParamEntry* entry = nullptr;
        for (const ParamEntry& e : model_->param_entries())
            if (e.name == t.param_name) entry = &e;
        ASSERT_NE(entry, nullptr);
        if (!entry->trainable) {
            EXPECT_FALSE(ref_.has(t.hf_name + ".grad")) << t.hf_name << " is not trained in HF";
            continue;
        }
        const testing::ReferenceTensor& expected = ref_.get(t.hf_name + ".grad");
        ASSERT_EQ(expected.numel(), t.numel()) << t.hf_name;
        ours.resize(static_cast<size_t>(t.numel()));
        copy_param_to_hf(ours.data(), t, model_->grad(t.param_name).f32());
        // The floor: 1% of the tensor's largest gradient, so entries near zero are judged by their
        // absolute error against the tensor's scale.
        float scale = 0;
        for (float g : expected.f32) scale = std::max(scale, std::fabs(g));
        const testing::ErrorStats s =
            testing::compare(ours.data(), expected.f32.data(), ours.size(), 1e-2 * scale + 1e-12);
        EXPECT_LE(s.max_rel, 1e-3) << t.hf_name;
        if (s.max_rel > worst_rel) {
            worst_rel = s.max_rel;
            worst = t.hf_name;
        }
        ++compared;
    }
    std::printf("[maxerr] model_reference gradients: %d tensors, worst %s rel=%.3e\n", compared,
                worst.c_str(), worst_rel);
    EXPECT_GT(compared, 40);
}

}  // namespace
}  // namespace moetron
