// The model's hand-written backward against central finite differences of its own forward, on a
// config small enough to perturb a sample of every tensor: dense and MoE blocks, MLA with
// low-rank q, group-limited routing with shared experts, one MTP module with an MoE block, and
// the sequence-wise balance loss. This is how the MTP and balance-loss gradients are verified
// (the PyTorch reference has neither). Also: micro-batch gradient accumulation and grad_scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/model/model.h"
#include "testing.h"

namespace moetron {
namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kSeq = 8;
constexpr uint64_t kSeed = 11;

ModelConfig gradcheck_config() {
    ModelConfig c;
    c.name = "gradcheck";
    c.vocab_size = 32;
    c.hidden_size = 16;
    c.num_hidden_layers = 2;
    c.first_k_dense_replace = 1;  // layer 0 dense, layer 1 MoE, the MTP block (layer 2) MoE
    c.intermediate_size = 24;
    c.moe_intermediate_size = 8;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 2;
    c.n_group = 4;
    c.topk_group = 2;
    c.routed_scaling_factor = 2.5;
    c.num_attention_heads = 4;
    c.q_lora_rank = 8;
    c.kv_lora_rank = 8;
    c.qk_nope_head_dim = 4;
    c.qk_rope_head_dim = 4;
    c.v_head_dim = 4;
    c.max_position_embeddings = 64;
    c.num_nextn_predict_layers = 1;
    // Larger than DeepSeek's 0.02 so that every path carries a gradient well above float noise.
    c.initializer_range = 0.3;
    return c;
}

struct MicroBatch {
    std::vector<int32_t> tokens, targets;
};

// Random tokens; targets are the next token, -1 at each sequence end and at one masked position.
MicroBatch make_batch(const ModelConfig& c, uint64_t seed) {
    MicroBatch mb;
    RngStream rng(seed, 1);
    const int64_t n = kBatch * kSeq;
    mb.tokens.resize(n);
    for (int32_t& t : mb.tokens) t = static_cast<int32_t>(rng.next_below(c.vocab_size));
    mb.targets.assign(n, -1);
    for (int64_t b = 0; b < kBatch; ++b)
        for (int64_t t = 0; t + 1 < kSeq; ++t)
            mb.targets[b * kSeq + t] = mb.tokens[b * kSeq + t + 1];
    mb.targets[3] = -1;
    return mb;
}

// Gains away from 1 and a nonzero correction bias, so that those paths are not special.
void perturb_gains_and_bias(Model& model) {
    for (const ParamEntry& e : model.param_entries()) {
        const bool is_norm = e.name.ends_with("norm");
        const bool is_bias = e.name.ends_with("router_bias");
        if (!is_norm && !is_bias) continue;
        const ParamRng rng(kSeed + 1, e.name);
        float* p = model.params() + e.offset;
        for (int64_t i = 0; i < e.numel; ++i)
            p[i] = (is_norm ? 1.0f : 0.0f) + (is_norm ? 0.2f : 0.05f) * rng.normal(i);
    }
}

// The other branches: a plain q projection, no shared experts, plain top-k without weight
// normalization, and two MTP depths (the first MoE, the second dense) chained together.
ModelConfig variant_config() {
    ModelConfig c = gradcheck_config();
    c.name = "gradcheck-variant";
    c.q_lora_rank = 0;
    c.n_shared_experts = 0;
    c.n_group = 1;
    c.topk_group = 1;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 1.0;
    c.first_k_dense_replace = 0;
    c.moe_layer_freq = 2;  // layer 0 MoE, layer 1 dense, MTP depth 1 (layer 2) MoE, depth 2 dense
    c.num_nextn_predict_layers = 2;
    return c;
}

std::unique_ptr<Model> make_model(const LossWeights& weights,
                                  const ModelConfig& config = gradcheck_config(),
                                  ModelRuntime runtime = {kBatch, kSeq}) {
    auto model = std::make_unique<Model>(config, runtime, weights);
    model->init_parameters(kSeed);
    perturb_gains_and_bias(*model);
    return model;
}

std::vector<float> gradients(Model& model, const MicroBatch& mb, float grad_scale = 1.0f) {
    model.zero_grads();
    model.forward_backward(mb.tokens.data(), mb.targets.data(), kBatch, kSeq, grad_scale);
    return {model.grads(), model.grads() + model.num_params()};
}

using LossOf = std::function<double(const MicroBatchLosses&)>;

// Central differences of loss_of(forward) at a few elements of every trainable tensor, against
// `analytic`. A perturbation that changes any routing decision is skipped (the loss is only
// piecewise smooth there); the skips are counted and must stay under a fifth.
void check_against_finite_differences(Model& model, const MicroBatch& mb,
                                      const std::vector<float>& analytic, const LossOf& loss_of,
                                      const char* what) {
    constexpr int kSamplesPerTensor = 4;
    constexpr double kRelativeStep = 0.02;  // of the element's magnitude ...
    constexpr double kMinStep = 5e-3;       // ... but at least this
    auto loss_at = [&](float* p, float value, std::vector<int32_t>* routing) {
        *p = value;
        const double loss =
            loss_of(model.forward(mb.tokens.data(), mb.targets.data(), kBatch, kSeq));
        *routing = model.last_routing();
        return loss;
    };

    model.forward(mb.tokens.data(), mb.targets.data(), kBatch, kSeq);
    const std::vector<int32_t> base_routing = model.last_routing();
    RngStream pick(kSeed, 7);
    std::vector<double> fd_all, an_all;
    int skipped = 0;
    double worst_rel = 0;
    std::string worst_name;
    for (const ParamEntry& e : model.param_entries()) {
        if (!e.trainable) continue;
        std::vector<double> fd, an;
        for (int s = 0; s < kSamplesPerTensor; ++s) {
            const int64_t i = static_cast<int64_t>(pick.next_below(static_cast<uint64_t>(e.numel)));
            float* p = model.params() + e.offset + i;
            const float saved = *p;
            const double step = std::max(kMinStep, kRelativeStep * std::fabs(saved));
            std::vector<int32_t> routing_up, routing_down;
            const double up = loss_at(p, static_cast<float>(saved + step), &routing_up);
            const double down = loss_at(p, static_cast<float>(saved - step), &routing_down);
            // The step actually taken in float32.
            const double taken =
                double(static_cast<float>(saved + step)) - double(static_cast<float>(saved - step));
            *p = saved;
            if (routing_up != base_routing || routing_down != base_routing) {
                ++skipped;
                continue;
            }
            fd.push_back((up - down) / taken);
            an.push_back(analytic[static_cast<size_t>(e.offset + i)]);
        }
        // Relative error with a floor: an entry much smaller than the loss's float32 resolution
        // over the step is judged by its absolute error.
        const testing::ErrorStats s = testing::compare(an.data(), fd.data(), an.size(), 2e-3);
        if (s.max_rel > worst_rel) {
            worst_rel = s.max_rel;
            worst_name = e.name;
        }
        EXPECT_LE(s.max_rel, 2e-2) << what << ": " << e.name;
        fd_all.insert(fd_all.end(), fd.begin(), fd.end());
        an_all.insert(an_all.end(), an.begin(), an.end());
    }
    const int total = static_cast<int>(fd_all.size()) + skipped;
    std::printf("[gradcheck] %s: %zu elements checked, %d skipped (routing changed), worst %s\n",
                what, fd_all.size(), skipped, worst_name.c_str());
    testing::expect_close("model_gradcheck", what,
                          testing::compare(an_all.data(), fd_all.data(), an_all.size(), 2e-3),
                          2e-2);
    EXPECT_LE(skipped * 5, total) << "too many perturbations changed the routing";
    // The check must be able to fail: the analytic gradient is not trivially zero.
    double norm = 0;
    for (double g : an_all) norm += g * g;
    EXPECT_GT(std::sqrt(norm), 1e-3) << what;
}

TEST(ModelGradcheck, TotalLossMatchesFiniteDifferences) {
    const LossWeights weights{0.5f, 0.1f};
    auto model = make_model(weights);
    const MicroBatch mb = make_batch(model->config(), 3);
    const std::vector<float> analytic = gradients(*model, mb);
    check_against_finite_differences(
        *model, mb, analytic,
        [&](const MicroBatchLosses& l) {
            return l.lm_loss + weights.mtp_lambda * l.mtp_loss + l.balance_loss;
        },
        "total loss");
}

TEST(ModelGradcheck, VariantBranchesMatchFiniteDifferences) {
    const LossWeights weights{0.5f, 0.1f};
    auto model = make_model(weights, variant_config());
    ASSERT_FALSE(model->config().mtp_layer_is_moe(1));
    const MicroBatch mb = make_batch(model->config(), 3);
    const std::vector<float> analytic = gradients(*model, mb);
    check_against_finite_differences(
        *model, mb, analytic,
        [&](const MicroBatchLosses& l) {
            return l.lm_loss + weights.mtp_lambda * l.mtp_loss + l.balance_loss;
        },
        "variant total loss");
}

// The MTP and balance terms alone: their analytic gradient is the difference between a model
// that weights the term and one that does not (same parameters), checked against differences
// of that term's reported value.
void check_one_term(const LossWeights& with_term, const LossOf& term, const char* what) {
    auto with = make_model(with_term);
    auto without = make_model({0.0f, 0.0f});
    const MicroBatch mb = make_batch(with->config(), 4);
    const std::vector<float> g_with = gradients(*with, mb);
    const std::vector<float> g_without = gradients(*without, mb);
    std::vector<float> analytic(g_with.size());
    for (size_t i = 0; i < analytic.size(); ++i) analytic[i] = g_with[i] - g_without[i];
    check_against_finite_differences(*with, mb, analytic, term, what);
}

TEST(ModelGradcheck, MtpLossMatchesFiniteDifferences) {
    check_one_term(
        {1.0f, 0.0f}, [](const MicroBatchLosses& l) { return l.mtp_loss; }, "mtp loss");
}

TEST(ModelGradcheck, BalanceLossMatchesFiniteDifferences) {
    // alpha large enough that the balance term's gradient stands well above float32 noise.
    check_one_term(
        {0.0f, 1.0f}, [](const MicroBatchLosses& l) { return l.balance_loss; }, "balance loss");
}

TEST(ModelGradcheck, FrozenBiasHasNoGradientAndForwardLeavesGradsAlone) {
    auto model = make_model({0.5f, 0.1f});
    const MicroBatch mb = make_batch(model->config(), 3);
    const std::vector<float> g = gradients(*model, mb);
    for (const char* name : {"layers.1.mlp.router_bias", "mtp.0.mlp.router_bias"}) {
        const TensorView bias_grad = model->grad(name);
        for (int64_t i = 0; i < bias_grad.numel(); ++i) EXPECT_EQ(bias_grad.f32()[i], 0.0f) << name;
    }
    model->forward(mb.tokens.data(), mb.targets.data(), kBatch, kSeq);
    EXPECT_TRUE(std::equal(g.begin(), g.end(), model->grads()));
}

TEST(ModelGradAccumulation, MicroBatchesAddAndGradScaleScales) {
    auto model = make_model({0.5f, 0.1f});
    const MicroBatch first = make_batch(model->config(), 5);
    const MicroBatch second = make_batch(model->config(), 6);
    const std::vector<float> g1 = gradients(*model, first);
    const std::vector<float> g2 = gradients(*model, second);

    model->zero_grads();
    const MicroBatchLosses l1 =
        model->forward_backward(first.tokens.data(), first.targets.data(), kBatch, kSeq, 1.0f);
    model->forward_backward(second.tokens.data(), second.targets.data(), kBatch, kSeq, 1.0f);
    std::vector<float> sum(g1.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = g1[i] + g2[i];
    testing::expect_close("model_accumulate", "two micro-batches vs sum",
                          testing::compare(model->grads(), sum.data(), sum.size(), 1e-3), 1e-5);

    const std::vector<float> quarter = gradients(*model, first, 0.25f);
    std::vector<float> scaled(g1.size());
    for (size_t i = 0; i < scaled.size(); ++i) scaled[i] = 0.25f * g1[i];
    testing::expect_close("model_accumulate", "grad_scale 0.25",
                          testing::compare(quarter.data(), scaled.data(), scaled.size(), 1e-3),
                          1e-5);

    // The losses do not depend on grad_scale, and forward() reports the same ones.
    const MicroBatchLosses again =
        model->forward(first.tokens.data(), first.targets.data(), kBatch, kSeq);
    EXPECT_DOUBLE_EQ(again.lm_loss, l1.lm_loss);
    EXPECT_DOUBLE_EQ(again.mtp_loss, l1.mtp_loss);
    EXPECT_DOUBLE_EQ(again.balance_loss, l1.balance_loss);
    EXPECT_EQ(l1.num_tokens, kBatch * (kSeq - 1) - 1);
    EXPECT_GT(l1.mtp_loss, 0.0);
    EXPECT_GT(l1.balance_loss, 0.0);
}

// A micro-batch smaller than the planned one uses a prefix of every activation buffer: same
// losses and gradients as a model planned for exactly that size.
TEST(ModelGradAccumulation, SmallerMicroBatchThanPlanned) {
    auto exact = make_model({0.5f, 0.1f});
    auto larger = make_model({0.5f, 0.1f}, gradcheck_config(), {kBatch + 1, kSeq + 5});
    const MicroBatch mb = make_batch(exact->config(), 8);
    exact->zero_grads();
    larger->zero_grads();
    const MicroBatchLosses a =
        exact->forward_backward(mb.tokens.data(), mb.targets.data(), kBatch, kSeq, 1.0f);
    const MicroBatchLosses b =
        larger->forward_backward(mb.tokens.data(), mb.targets.data(), kBatch, kSeq, 1.0f);
    EXPECT_DOUBLE_EQ(a.lm_loss, b.lm_loss);
    EXPECT_DOUBLE_EQ(a.mtp_loss, b.mtp_loss);
    EXPECT_DOUBLE_EQ(a.balance_loss, b.balance_loss);
    testing::expect_close(
        "model_accumulate", "planned larger vs exact",
        testing::compare(larger->grads(), exact->grads(), exact->num_params(), 1e-3), 1e-6);
}

}  // namespace
}  // namespace moetron
