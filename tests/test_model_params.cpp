// The model's parameter table and bookkeeping: counter-based initialization, the parameter count
// against model/flops, the Hugging Face name map, the router bias update and expert-load stats,
// and the errors bad input gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"
#include "moetron/model/hf_names.h"
#include "moetron/model/model.h"
#include "moetron/model/params.h"
#include "tiny_model_config.h"

namespace moetron {
namespace {

ModelConfig tiny_model_config() {
    return testing::tiny_model_config();
}

// DeepSeek-V3 671B (DESIGN.md sec. 5).
ModelConfig dsv3_config() {
    ModelConfig c;
    c.name = "dsv3";
    c.vocab_size = 129280;
    c.hidden_size = 7168;
    c.num_hidden_layers = 61;
    c.first_k_dense_replace = 3;
    c.intermediate_size = 18432;
    c.moe_intermediate_size = 2048;
    c.n_routed_experts = 256;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 8;
    c.n_group = 8;
    c.topk_group = 4;
    c.routed_scaling_factor = 2.5;
    c.num_attention_heads = 128;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.max_position_embeddings = 163840;
    c.num_nextn_predict_layers = 1;
    return c;
}

int64_t total_numel(const std::vector<TensorSpec>& specs) {
    int64_t n = 0;
    for (const TensorSpec& s : specs) n += s.numel();
    return n;
}

TEST(ModelParams, CountMatchesFlopsAccounting) {
    ModelConfig plain_q = tiny_model_config();
    plain_q.q_lora_rank = 0;
    ModelConfig sparse_moe = tiny_model_config();
    sparse_moe.num_hidden_layers = 5;
    sparse_moe.moe_layer_freq = 2;
    sparse_moe.num_nextn_predict_layers = 2;
    for (const ModelConfig& c : {tiny_model_config(), plain_q, sparse_moe, dsv3_config()}) {
        const ParamCounts counts = count_parameters(c);
        EXPECT_EQ(static_cast<double>(total_numel(model_param_specs(c))), counts.total + counts.mtp)
            << c.name << " q_lora=" << c.q_lora_rank << " freq=" << c.moe_layer_freq;
    }
    // DeepSeek-V3: 671B in the main model; its checkpoint holds 685B, which counts the MTP
    // layer's own copies of the embedding and output head (aliases in the HF name map).
    const ParamCounts dsv3 = count_parameters(dsv3_config());
    EXPECT_NEAR(dsv3.total / 1e9, 671.0, 1.0);
    double checkpoint_numel = 0;
    const HfNameMap dsv3_names(dsv3_config());
    for (const HfTensor& t : dsv3_names.tensors())
        checkpoint_numel += static_cast<double>(t.numel());
    EXPECT_NEAR(checkpoint_numel / 1e9, 685.0, 1.0);

    const ModelConfig c = tiny_model_config();
    Model model(c, {2, 8}, {});
    EXPECT_EQ(model.num_params(), total_numel(model_param_specs(c)));
    const ParamEntry& last = model.param_entries().back();
    EXPECT_EQ(last.offset + last.numel, model.num_params());  // packed, no padding
}

// moetron info's per-rank plan is the engine's own: on one process it adds up to the arenas a
// Model allocates, and the expert side is the MoE layers' R = N * K rows.
TEST(ModelMemoryPlan, AddsUpToTheModelsArenas) {
    const ModelConfig c = tiny_model_config();
    const ModelRuntime runtime{2, 16};
    const Model model(c, runtime, {});
    const RankMemoryPlan p =
        plan_rank_memory(c, runtime, parallel::Topology{}, MoeSettings{}, true);
    EXPECT_EQ(p.parameters + p.gradients + p.activations + p.expert_side + p.communication,
              model.planned_bytes());
    EXPECT_EQ(p.parameters, static_cast<size_t>(model.num_params()) * sizeof(float));
    EXPECT_EQ(p.expert_rows, 2 * 16 * c.num_experts_per_tok);
    // 3 MoE blocks (layers 1-2 and the MTP block's), saved (2D + 3F) + scratch (D + 3F) floats
    // per row; the scratch is shared by every layer.
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    EXPECT_EQ(p.expert_side,
              static_cast<size_t>(p.expert_rows * (3 * (2 * D + 3 * F) + (D + 3 * F))) * 4);
    // One process exchanges nothing: the dispatcher holds each MoE block's routing indices.
    EXPECT_EQ(p.communication, model.expert_dispatcher()->buffer_bytes());
}

TEST(ModelParams, FlagsOfNormsBiasesAndWeights) {
    for (const TensorSpec& s : model_param_specs(tiny_model_config())) {
        const bool is_norm = s.name.ends_with("norm");
        const bool is_bias = s.name.ends_with("router_bias");
        EXPECT_EQ(s.weight_decay, !is_norm && !is_bias) << s.name;
        EXPECT_EQ(s.trainable, !is_bias) << s.name;
        EXPECT_EQ(s.init, is_norm   ? ParamInit::ones
                          : is_bias ? ParamInit::zeros
                                    : ParamInit::normal)
            << s.name;
    }
}

TEST(ModelParams, CounterBasedInitialization) {
    const ModelConfig c = tiny_model_config();
    Model a(c, {1, 4}, {});
    Model b(c, {2, 16}, {});  // another runtime: the parameters do not depend on it
    a.init_parameters(42);
    b.init_parameters(42);
    ASSERT_EQ(a.num_params(), b.num_params());
    EXPECT_TRUE(std::equal(a.params(), a.params() + a.num_params(), b.params()));

    // Element i of tensor P is stddev * ParamRng(seed, P).normal(i): any shard reproduces it.
    const std::string name = "layers.1.mlp.experts.gate_up";
    const TensorView experts = a.param(name);
    const ParamRng rng(42, name);
    for (int64_t i : {int64_t{0}, int64_t{1}, experts.numel() / 2, experts.numel() - 1}) {
        EXPECT_EQ(experts.f32()[i], static_cast<float>(c.initializer_range) * rng.normal(i)) << i;
    }
    EXPECT_EQ(a.param("layers.0.attn_norm").f32()[5], 1.0f);
    EXPECT_EQ(a.param("mtp.0.final_norm").f32()[0], 1.0f);
    EXPECT_EQ(a.param("layers.2.mlp.router_bias").f32()[3], 0.0f);

    // Spread of a large tensor is the configured stddev.
    const TensorView head = a.param("head");
    double sum_squares = 0;
    for (int64_t i = 0; i < head.numel(); ++i) sum_squares += double(head.f32()[i]) * head.f32()[i];
    EXPECT_NEAR(std::sqrt(sum_squares / head.numel()), c.initializer_range, 0.05 * 0.02);

    b.init_parameters(43);
    EXPECT_NE(a.param("embed").f32()[0], b.param("embed").f32()[0]);
}

// Every element of every moetron parameter is covered by exactly one non-alias HF tensor.
void expect_hf_map_tiles_params(const ModelConfig& c, HfExpertLayout layout) {
    const HfNameMap map(c, layout);
    ParamTable table(model_param_specs(c));
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> spans;  // param -> [begin, end)
    for (const HfTensor& t : map.tensors()) {
        const ParamEntry* e = table.find(t.param_name);
        ASSERT_NE(e, nullptr) << t.hf_name << " -> unknown " << t.param_name;
        ASSERT_LE(t.param_offset + t.numel(), e->numel) << t.hf_name;
        if (!t.alias) spans[t.param_name].push_back({t.param_offset, t.param_offset + t.numel()});
    }
    for (const ParamEntry& e : table.entries()) {
        auto& s = spans[e.name];
        std::sort(s.begin(), s.end());
        int64_t covered = 0;
        for (const auto& [begin, end] : s) {
            EXPECT_EQ(begin, covered) << e.name << ": a gap or an overlap";
            covered = end;
        }
        EXPECT_EQ(covered, e.numel) << e.name;
    }
}

TEST(ModelParams, HuggingFaceNamesTileEveryParameter) {
    ModelConfig plain_q = tiny_model_config();
    plain_q.q_lora_rank = 0;
    for (const ModelConfig& c : {tiny_model_config(), plain_q}) {
        expect_hf_map_tiles_params(c, HfExpertLayout::per_expert);
        expect_hf_map_tiles_params(c, HfExpertLayout::fused);
    }
}

TEST(ModelParams, HuggingFaceNamesOfFusedAndMtpTensors) {
    const ModelConfig c = tiny_model_config();
    const int64_t F = c.moe_intermediate_size, D = c.hidden_size;
    const HfNameMap map(c);
    const HfTensor& up = map.at("model.layers.1.mlp.experts.3.up_proj.weight");
    EXPECT_EQ(up.param_name, "layers.1.mlp.experts.gate_up");
    EXPECT_EQ(up.param_offset, 3 * 2 * F * D + F * D);
    EXPECT_EQ(up.hf_shape, (Shape{F, D}));
    const HfTensor& down = map.at("model.layers.2.mlp.experts.7.down_proj.weight");
    EXPECT_EQ(down.param_offset, 7 * D * F);
    EXPECT_EQ(map.at("model.layers.0.mlp.up_proj.weight").param_offset, c.intermediate_size * D);
    EXPECT_EQ(map.at("model.layers.2.mlp.gate.e_score_correction_bias").param_name,
              "layers.2.mlp.router_bias");
    EXPECT_EQ(map.at("model.layers.1.self_attn.kv_a_proj_with_mqa.weight").param_name,
              "layers.1.attn.kv_a_proj");
    // MTP module 0 is model.layers.3 (num_hidden_layers + 0).
    EXPECT_EQ(map.at("model.layers.3.enorm.weight").param_name, "mtp.0.emb_norm");
    EXPECT_EQ(map.at("model.layers.3.hnorm.weight").param_name, "mtp.0.hidden_norm");
    EXPECT_EQ(map.at("model.layers.3.eh_proj.weight").hf_shape, (Shape{D, 2 * D}));
    EXPECT_EQ(map.at("model.layers.3.shared_head.norm.weight").param_name, "mtp.0.final_norm");
    EXPECT_EQ(map.at("model.layers.3.mlp.experts.0.gate_proj.weight").param_name,
              "mtp.0.mlp.experts.gate_up");
    EXPECT_TRUE(map.at("model.layers.3.shared_head.head.weight").alias);
    EXPECT_EQ(map.at("model.layers.3.embed_tokens.weight").param_name, "embed");
    EXPECT_EQ(map.find("model.layers.4.enorm.weight"), nullptr);
    EXPECT_THROW(map.at("model.layers.0.mlp.experts.0.gate_proj.weight"), Error);

    const HfNameMap fused(c, HfExpertLayout::fused);
    EXPECT_EQ(fused.at("model.layers.1.mlp.experts.gate_up_proj").hf_shape,
              (Shape{c.n_routed_experts, 2 * F, D}));

    // A round trip through the copy helpers.
    std::vector<float> param(static_cast<size_t>(c.n_routed_experts * 2 * F * D), 0.0f);
    std::vector<float> hf(static_cast<size_t>(F * D)), back(hf.size());
    for (size_t i = 0; i < hf.size(); ++i) hf[i] = static_cast<float>(i);
    copy_hf_to_param(param.data(), up, hf.data());
    EXPECT_EQ(param[static_cast<size_t>(up.param_offset) + 5], 5.0f);
    copy_param_to_hf(back.data(), up, param.data());
    EXPECT_EQ(back, hf);
}

// A one-MoE-layer model whose router is steered by hand: a zero gate makes every score 0.5, and
// the correction bias then picks the same experts for every token.
ModelConfig one_moe_layer_config() {
    ModelConfig c = tiny_model_config();
    c.num_hidden_layers = 1;
    c.first_k_dense_replace = 0;
    c.num_nextn_predict_layers = 0;
    return c;
}

TEST(ModelRouterBias, LoadStatsAndSignUpdateOnAHandMadeRouting) {
    const ModelConfig c = one_moe_layer_config();
    const int64_t B = 2, S = 8, n = B * S, E = c.n_routed_experts;
    Model model(c, {B, S}, {0.0f, 0.0f});
    model.init_parameters(1);
    TensorView gate = model.param("layers.0.mlp.router");
    std::fill(gate.f32(), gate.f32() + gate.numel(), 0.0f);
    float* bias = model.param("layers.0.mlp.router_bias").f32();
    // Group 0 (experts 0, 1) scores highest, then group 1; top-2 inside them: experts 0 and 1.
    const std::vector<float> initial_bias = {0.3f, 0.2f, 0.1f, 0.1f, 0.0f, 0.0f, 0.0f, 0.0f};
    std::copy(initial_bias.begin(), initial_bias.end(), bias);

    std::vector<int32_t> tokens(n), targets(n);
    for (int64_t i = 0; i < n; ++i) {
        tokens[i] = static_cast<int32_t>((7 * i) % c.vocab_size);
        targets[i] = static_cast<int32_t>((7 * i + 3) % c.vocab_size);
    }
    model.forward(tokens.data(), targets.data(), B, S);  // forward() does not count
    EXPECT_EQ(model.expert_load().max_over_mean, 0.0);
    model.forward_backward(tokens.data(), targets.data(), B, S, 1.0f);

    ExpertLoadStats stats = model.expert_load();
    ASSERT_EQ(stats.tokens_per_expert.size(), 1u);
    const std::vector<int64_t> expected = {n, n, 0, 0, 0, 0, 0, 0};
    EXPECT_EQ(stats.tokens_per_expert[0], expected);
    // mean = 2n / 8: the two busy experts carry 4x the mean, the idle ones 0.
    EXPECT_DOUBLE_EQ(stats.max_over_mean, 4.0);
    EXPECT_DOUBLE_EQ(stats.min_over_mean, 0.0);

    const float gamma = 0.01f;
    model.update_router_bias(gamma);
    for (int64_t e = 0; e < E; ++e) {
        const float step = e < 2 ? -gamma : gamma;  // overloaded down, underloaded up
        EXPECT_FLOAT_EQ(bias[e], initial_bias[e] + step) << e;
    }
    stats = model.expert_load();  // the update resets the counts
    EXPECT_EQ(stats.tokens_per_expert[0], std::vector<int64_t>(E, 0));
    EXPECT_EQ(stats.max_over_mean, 0.0);
    // Nothing counted: a second update leaves the bias alone.
    model.update_router_bias(gamma);
    EXPECT_FLOAT_EQ(bias[0], initial_bias[0] - gamma);
}

TEST(ModelRouterBias, RepeatedUpdatesBalanceTheLoad) {
    ModelConfig c = one_moe_layer_config();
    c.initializer_range = 0.2;  // distinct scores per token
    const int64_t B = 4, S = 16, n = B * S;
    Model model(c, {B, S}, {0.0f, 0.0f});
    model.init_parameters(5);
    // Start strongly imbalanced.
    float* bias = model.param("layers.0.mlp.router_bias").f32();
    bias[0] = 0.5f;
    bias[1] = 0.4f;
    std::vector<int32_t> tokens(n), targets(n, -1);
    RngStream rng(9, 0);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_below(c.vocab_size));

    model.forward_backward(tokens.data(), targets.data(), B, S, 1.0f);
    const double initial = model.expert_load().max_over_mean;
    model.update_router_bias(0.05f);
    double last = initial;
    for (int step = 0; step < 40; ++step) {
        model.forward_backward(tokens.data(), targets.data(), B, S, 1.0f);
        last = model.expert_load().max_over_mean;
        model.update_router_bias(0.05f);
    }
    std::printf("[router_bias] max/mean load %.2f -> %.2f after 40 updates\n", initial, last);
    EXPECT_GE(initial, 2.5);
    EXPECT_LT(last, 2.0);
}

TEST(ModelErrors, BadInputsAreNamed) {
    const ModelConfig c = one_moe_layer_config();
    Model model(c, {2, 8}, {});
    model.init_parameters(1);
    std::vector<int32_t> tokens(16, 1), targets(16, 2);
    EXPECT_THROW(model.forward(tokens.data(), targets.data(), 3, 8), Error);  // B > planned
    EXPECT_THROW(model.forward(tokens.data(), targets.data(), 2, 9), Error);  // S > planned
    tokens[4] = static_cast<int32_t>(c.vocab_size);
    try {
        model.forward(tokens.data(), targets.data(), 2, 8);
        ADD_FAILURE() << "a token outside the vocabulary was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos)
            << e.what();
    }
    tokens[4] = 1;
    targets[3] = -7;
    EXPECT_THROW(model.forward(tokens.data(), targets.data(), 2, 8), Error);

    ModelConfig tied = c;
    tied.tie_word_embeddings = true;
    EXPECT_THROW(Model(tied, {1, 8}, {}), Error);
    EXPECT_THROW(Model(c, {1, c.max_position_embeddings + 1}, {}), Error);
    EXPECT_THROW(model.param("layers.0.no_such_tensor"), Error);
}

}  // namespace
}  // namespace moetron
