// Parameter and FLOP accounting against published DeepSeek-V3 figures, a second transcription of
// Megatron-LM's formula, and a brute-force sum of tiny's tensor shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"

namespace moetron {
namespace {

ModelConfig preset(const std::string& name) {
    return load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/" + name + ".toml");
}

void expect_within(double actual, double expected, double rel_tol, const char* what) {
    const double rel = std::abs(actual - expected) / std::abs(expected);
    std::printf("[figure] %s = %.6e (expected %.6e, rel err %.3e)\n", what, actual, expected, rel);
    EXPECT_LE(rel, rel_tol) << what;
}

// ---- DeepSeek-V3 671B against its published figures ----

TEST(Params, Dsv3TotalIs671B) {
    const ParamCounts p = count_parameters(preset("dsv3-671b"));
    expect_within(p.total, 671.0e9, 0.005, "dsv3 params_total");
    // The exact sum of the HF checkpoint's main-model tensor shapes (model.layers.0-60,
    // embed_tokens, norm, lm_head), worked by hand: embedding + head 2 * 129280 * 7168, final norm
    // 7168, per layer MLA 187,107,328 + norms 14,336, 3 dense MLPs of 396,361,728, 58 MoE blocks of
    // 11,320,164,608 (256 + 1 experts of 44,040,192, gate 1,835,008, bias 256).
    EXPECT_EQ(p.total, 671026419200.0);
    EXPECT_EQ(p.routed_expert_single, 44040192.0);
}

TEST(Params, Dsv3MtpModuleIs11_6B) {
    const ParamCounts p = count_parameters(preset("dsv3-671b"));
    expect_within(p.mtp, 11.6e9, 0.005, "dsv3 params_mtp");
    // eh_proj 2 D^2 + enorm, hnorm, shared_head.norm + one MoE block (layer 61 of the checkpoint).
    EXPECT_EQ(p.mtp, 102760448.0 + 3 * 7168.0 + 187107328.0 + 14336.0 + 11320164608.0);
}

TEST(Params, Dsv3ActiveIs37B) {
    const ParamCounts p = count_parameters(preset("dsv3-671b"));
    expect_within(p.active, 37.4e9, 0.005, "dsv3 params_active");
    // Active differs from total only in the routed experts: 8 of 256 in each of 58 MoE layers.
    EXPECT_EQ(p.total - p.active, 58.0 * (256 - 8) * 44040192.0);
}

// NVIDIA: Megatron Core trains DeepSeek-V3 on GB300 at 1,199 TFLOPs/GPU with 4,612 tokens/s/GPU
// (MTP counted), and at 1,088 TFLOPs/GPU with 4,357 tokens/s/GPU (MTP not counted), seq 4096.
TEST(Flops, Dsv3ReproducesPublishedTflopsPerGpu) {
    const ModelConfig c = preset("dsv3-671b");
    const FlopsPerToken with_mtp = flops_per_token(c, 4096, true);
    const FlopsPerToken without_mtp = flops_per_token(c, 4096, false);
    expect_within(with_mtp.total, 2.600e11, 0.005, "dsv3 flops/token with MTP");
    expect_within(without_mtp.total, 2.497e11, 0.005, "dsv3 flops/token without MTP");
    expect_within(4612.0 * with_mtp.total, 1199e12, 0.005, "4612 tok/s/GPU in FLOP/s");
    expect_within(4357.0 * without_mtp.total, 1088e12, 0.005, "4357 tok/s/GPU in FLOP/s");
    EXPECT_EQ(without_mtp.mtp, 0.0);
    EXPECT_GT(with_mtp.mtp, 0.0);
}

// A literal transcription of Megatron-LM's transformer_flops() (megatron/training/training.py)
// for the MLA + MoE + MTP path, in its own variable names, for batch 1, per token.
double megatron_flops_per_token(const ModelConfig& c, int64_t seq_length, bool mtp) {
    const double hidden_size = c.hidden_size, num_attention_heads = c.num_attention_heads;
    const double qk_head_dim = c.qk_nope_head_dim, qk_pos_emb_head_dim = c.qk_rope_head_dim;
    const double v_head_dim = c.v_head_dim, q_lora_rank = c.q_lora_rank;
    const double kv_lora_rank = c.kv_lora_rank, seq = seq_length;
    double num_moe_layers = 0, num_dense_layers = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        (c.is_moe_layer(i) ? num_moe_layers : num_dense_layers) += 1;
    }
    const bool last_layer_is_moe = c.is_moe_layer(c.num_hidden_layers - 1);
    const double mtp_num_layers = mtp ? c.num_nextn_predict_layers : 0;
    num_moe_layers += last_layer_is_moe * mtp_num_layers;
    num_dense_layers += (1 - last_layer_is_moe) * mtp_num_layers;
    const double num_layers = c.num_hidden_layers + mtp_num_layers;
    const double fb = 3, fma = 2, ffn = 3;  // SwiGLU
    const double q_term =
        q_lora_rank * (hidden_size + num_attention_heads * (qk_head_dim + qk_pos_emb_head_dim) + 1);
    const double standard_self_attn_term =
        fb * fma *
        (q_term +
         kv_lora_rank * (hidden_size + num_attention_heads * (qk_head_dim + v_head_dim) + 1) +
         hidden_size * qk_pos_emb_head_dim + (num_attention_heads * v_head_dim) * hidden_size +
         seq * (num_attention_heads * (qk_head_dim + qk_pos_emb_head_dim)) / 2 +
         seq * num_attention_heads * v_head_dim / 2);
    const double shared = c.n_shared_experts * c.moe_intermediate_size;
    return fb * fma * hidden_size *
               (c.intermediate_size * ffn * num_dense_layers +
                c.moe_intermediate_size * c.num_experts_per_tok * ffn * num_moe_layers +
                shared * ffn * num_moe_layers) +
           standard_self_attn_term * num_layers +
           fb * fma * mtp_num_layers * (3 * hidden_size + 2 * hidden_size * hidden_size) +
           fb * fma * hidden_size * c.vocab_size * (mtp_num_layers + 1);
}

TEST(Flops, MatchesMegatronTranscriptionOnEveryPreset) {
    for (const std::string name : {"tiny", "small", "dsv3-671b"}) {
        const ModelConfig c = preset(name);
        for (int64_t seq : {64, 512, 4096}) {
            for (bool mtp : {false, true}) {
                SCOPED_TRACE(name + " seq " + std::to_string(seq) + (mtp ? " +mtp" : ""));
                const double expected = megatron_flops_per_token(c, seq, mtp);
                EXPECT_NEAR(flops_per_token(c, seq, mtp).total, expected, 1e-12 * expected);
            }
        }
    }
}

TEST(Flops, PartsSumToTotalAndScaleAsTheyShould) {
    const ModelConfig c = preset("small");
    const FlopsPerToken a = flops_per_token(c, 512, true);
    EXPECT_DOUBLE_EQ(a.total, a.attention_linear + a.attention_core + a.dense_mlp + a.moe_shared +
                                  a.moe_routed + a.logits + a.mtp);
    // Only the attention core depends on the sequence length, linearly (causal S/2 keys).
    const FlopsPerToken b = flops_per_token(c, 1024, true);
    EXPECT_DOUBLE_EQ(b.attention_core, 2 * a.attention_core);
    EXPECT_DOUBLE_EQ(b.attention_linear, a.attention_linear);
    EXPECT_DOUBLE_EQ(b.moe_routed, a.moe_routed);
    // Routed FLOPs follow K, not E.
    ModelConfig more_experts = c;
    more_experts.n_routed_experts *= 2;
    EXPECT_DOUBLE_EQ(flops_per_token(more_experts, 512, true).moe_routed, a.moe_routed);
    // 6 FLOPs per active weight for every GEMM weight: the routed part is 6 * K * expert size.
    const ParamCounts p = count_parameters(c);
    EXPECT_DOUBLE_EQ(a.moe_routed,
                     6.0 * c.num_moe_layers() * c.num_experts_per_tok * p.routed_expert_single);
    EXPECT_THROW(flops_per_token(c, 0, true), Error);
}

TEST(Flops, LayerFlopsSumToModelFlops) {
    const ModelConfig c = preset("dsv3-671b");
    const LayerFlopsPerToken dense = layer_flops_per_token(c, 4096, false);
    const LayerFlopsPerToken moe = layer_flops_per_token(c, 4096, true);
    const FlopsPerToken f = flops_per_token(c, 4096, false);
    EXPECT_DOUBLE_EQ(f.total, 3 * dense.total() + 58 * moe.total() + f.logits);
    EXPECT_EQ(dense.moe_routed, 0.0);
    EXPECT_EQ(moe.dense_mlp, 0.0);
}

// ---- parameter counts: brute force over the tensors of tiny ----

struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
};

int64_t numel(const Tensor& t) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    return n;
}

// The tensors of one block of tiny (D 64, H 4, q_lora 32, kv_lora 32, nope 16, rope 8, v 16;
// dense F 128; MoE 8 experts of F 32 + 1 shared), as DeepSeek-V3's HF modeling code allocates them.
std::vector<Tensor> tiny_block(const std::string& prefix, bool moe) {
    std::vector<Tensor> t = {
        {prefix + "input_layernorm", {64}},
        {prefix + "self_attn.q_a_proj", {32, 64}},
        {prefix + "self_attn.q_a_layernorm", {32}},
        {prefix + "self_attn.q_b_proj", {4 * (16 + 8), 32}},
        {prefix + "self_attn.kv_a_proj_with_mqa", {32 + 8, 64}},
        {prefix + "self_attn.kv_a_layernorm", {32}},
        {prefix + "self_attn.kv_b_proj", {4 * (16 + 16), 32}},
        {prefix + "self_attn.o_proj", {64, 4 * 16}},
        {prefix + "post_attention_layernorm", {64}},
    };
    if (!moe) {
        t.push_back({prefix + "mlp.gate_proj", {128, 64}});
        t.push_back({prefix + "mlp.up_proj", {128, 64}});
        t.push_back({prefix + "mlp.down_proj", {64, 128}});
        return t;
    }
    t.push_back({prefix + "mlp.gate.weight", {8, 64}});
    t.push_back({prefix + "mlp.gate.e_score_correction_bias", {8}});
    for (int e = 0; e < 8; ++e) {
        const std::string expert = prefix + "mlp.experts." + std::to_string(e) + ".";
        t.push_back({expert + "gate_proj", {32, 64}});
        t.push_back({expert + "up_proj", {32, 64}});
        t.push_back({expert + "down_proj", {64, 32}});
    }
    t.push_back({prefix + "mlp.shared_experts.gate_proj", {32, 64}});
    t.push_back({prefix + "mlp.shared_experts.up_proj", {32, 64}});
    t.push_back({prefix + "mlp.shared_experts.down_proj", {64, 32}});
    return t;
}

TEST(Params, TinyEqualsTheSumOfItsTensorShapes) {
    const ModelConfig c = preset("tiny");
    std::vector<Tensor> main = {
        {"embed_tokens", {256, 64}}, {"norm", {64}}, {"lm_head", {256, 64}}};
    for (int layer = 0; layer < 3; ++layer) {
        for (Tensor& t : tiny_block("layers." + std::to_string(layer) + ".", layer >= 1)) {
            main.push_back(std::move(t));
        }
    }
    // MTP module (layer 3 in checkpoint numbering): its own norms and projection, then a MoE block.
    std::vector<Tensor> mtp = {{"mtp.enorm", {64}},
                               {"mtp.hnorm", {64}},
                               {"mtp.eh_proj", {64, 2 * 64}},
                               {"mtp.shared_head.norm", {64}}};
    for (Tensor& t : tiny_block("mtp.block.", true)) mtp.push_back(std::move(t));

    int64_t main_sum = 0, mtp_sum = 0, routed_sum = 0;
    for (const Tensor& t : main) {
        main_sum += numel(t);
        if (t.name.find(".experts.") != std::string::npos) routed_sum += numel(t);
    }
    for (const Tensor& t : mtp) mtp_sum += numel(t);

    const ParamCounts p = count_parameters(c);
    EXPECT_EQ(p.total, static_cast<double>(main_sum));
    EXPECT_EQ(p.total, 217232.0);
    EXPECT_EQ(p.mtp, static_cast<double>(mtp_sum));
    EXPECT_EQ(p.moe_routed, static_cast<double>(routed_sum));
    EXPECT_EQ(p.active, static_cast<double>(main_sum - routed_sum) + routed_sum * 2.0 / 8.0);
    EXPECT_EQ(p.total, p.embedding + p.output_head + p.final_norm + p.attention + p.layer_norms +
                           p.dense_mlp + p.moe_shared + p.moe_routed + p.router);
}

TEST(Params, TiedEmbeddingsAndPlainQProjection) {
    ModelConfig c = preset("tiny");
    const ParamCounts base = count_parameters(c);
    c.tie_word_embeddings = true;
    EXPECT_EQ(count_parameters(c).output_head, 0.0);
    EXPECT_EQ(count_parameters(c).total, base.total - 256 * 64);

    c = preset("tiny");
    c.q_lora_rank = 0;  // q = W_q x with W_q (H * qk_head_dim, D)
    const LayerParamCounts plain = count_layer_parameters(c, false);
    const LayerParamCounts low_rank = count_layer_parameters(preset("tiny"), false);
    EXPECT_EQ(plain.attention - low_rank.attention,
              4.0 * 24 * 64 - (32.0 * 64 + 32 + 4.0 * 24 * 32));
}

TEST(Params, ActiveEqualsTotalWhenEveryExpertIsChosen) {
    ModelConfig c = preset("tiny");
    c.num_experts_per_tok = 4;
    c.n_group = 1;
    c.topk_group = 1;
    c.n_routed_experts = 4;
    const ParamCounts p = count_parameters(c);
    EXPECT_EQ(p.active, p.total);
}

TEST(Params, MtpBlockFollowsTheLayerIndexItTakes) {
    ModelConfig c = preset("tiny");  // 3 layers: the MTP block is layer index 3
    c.moe_layer_freq = 2;            // layer 2 MoE, layer 3 (the MTP block) dense
    ASSERT_FALSE(c.mtp_layer_is_moe(0));
    const double dense_block = count_layer_parameters(c, false).total();
    EXPECT_EQ(count_parameters(c).mtp, 64.0 * 128 + 3 * 64 + dense_block);
    EXPECT_EQ(count_mtp_module_parameters(c, 0), count_parameters(c).mtp);
    const FlopsPerToken f = flops_per_token(c, 64, true);
    EXPECT_DOUBLE_EQ(f.mtp, 6.0 * (3 * 64 + 2 * 64 * 64) +
                                layer_flops_per_token(c, 64, false).total() + f.logits);
}

TEST(Params, SmallIsTensOfMillions) {
    const ParamCounts p = count_parameters(preset("small"));
    std::printf("[figure] small params_total = %.4e, active = %.4e\n", p.total, p.active);
    EXPECT_GT(p.total, 10e6);
    EXPECT_LT(p.total, 100e6);
}

}  // namespace
}  // namespace moetron
