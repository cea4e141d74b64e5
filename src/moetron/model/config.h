// The model's shape: DeepSeek-V3's Hugging Face config.json keys, one field each, under the
// same names, so a config.json loads as is and a TOML preset reads like one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace moetron {

struct ModelConfig {
    std::string name = "unnamed";  // preset name, for reports

    int64_t vocab_size = 0;             // V
    int64_t hidden_size = 0;            // D
    int64_t num_hidden_layers = 0;      // main-model transformer blocks
    int64_t first_k_dense_replace = 0;  // the first layers use a dense MLP instead of MoE
    int64_t moe_layer_freq = 1;         // after those, every moe_layer_freq-th layer is MoE
    int64_t intermediate_size = 0;      // F of the dense MLP
    int64_t moe_intermediate_size = 0;  // F of each routed and shared expert
    int64_t n_routed_experts = 0;       // E
    int64_t n_shared_experts = 0;       // shared experts (one fused MLP of n * F)
    int64_t num_experts_per_tok = 0;    // K
    int64_t n_group = 1;                // G: expert groups (nodes/domains in DeepSeek-V3)
    int64_t topk_group = 1;             // groups kept per token
    double routed_scaling_factor = 1.0;
    std::string scoring_func = "sigmoid";
    std::string topk_method = "noaux_tc";  // DeepSeek-V3's group-limited, bias-corrected top-k
    bool norm_topk_prob = true;

    int64_t num_attention_heads = 0;  // H
    int64_t q_lora_rank = 0;          // 0: a plain q projection (no low-rank q)
    int64_t kv_lora_rank = 0;         // compressed kv latent (512 in DeepSeek-V3)
    int64_t qk_nope_head_dim = 0;
    int64_t qk_rope_head_dim = 0;  // R
    int64_t v_head_dim = 0;
    double rope_theta = 10000.0;
    int64_t max_position_embeddings = 4096;

    double rms_norm_eps = 1e-6;
    int64_t num_nextn_predict_layers = 0;  // MTP depth
    bool tie_word_embeddings = false;
    double initializer_range = 0.02;  // stddev of the normal initialization

    int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
    bool is_moe_layer(int64_t layer) const {
        return n_routed_experts > 0 && layer >= first_k_dense_replace &&
               layer % moe_layer_freq == 0;
    }
    int64_t num_moe_layers() const { return num_moe_layers_in(0, num_hidden_layers); }
    // MoE layers among layer indices [begin, end), counted in closed form.
    int64_t num_moe_layers_in(int64_t begin, int64_t end) const;
    int64_t num_dense_layers() const { return num_hidden_layers - num_moe_layers(); }
    // MTP depth d (0-based) sits after the main layers, as layer num_hidden_layers + d in
    // DeepSeek-V3's checkpoint (model.layers.61 for its one MTP module); its block is MoE or
    // dense by the same rule as a main layer. Megatron-LM's FLOP count agrees for DeepSeek-V3.
    bool mtp_layer_is_moe(int64_t depth) const { return is_moe_layer(num_hidden_layers + depth); }
};

// Reads a TOML preset or a Hugging Face config.json (chosen by content: a JSON object or TOML).
// A TOML file may also hold a [train] table; it is left to checkpoint/train_config.h and ignored
// here. Unknown keys are errors that name the key and the closest known key; impossible values
// (heads or experts not dividing, top-k larger than the experts, ...) are errors that say which.
ModelConfig load_model_config(const std::string& path);
ModelConfig parse_model_config_toml(std::string_view text, std::string_view source_name);
ModelConfig parse_model_config_json(std::string_view text, std::string_view source_name);

// Every field under its Hugging Face key ("name" included): the body of an exported config.json,
// and what checkpoints record; parse_model_config_json reads it back.
nlohmann::json model_config_to_json(const ModelConfig& config);

// Throws moetron::Error naming the first impossible value.
void validate_model_config(const ModelConfig& config);

// One line for logs and reports: "dsv3-671b: V=129280 D=7168 L=61 (3 dense) ...".
std::string describe_model_config(const ModelConfig& config);

}  // namespace moetron
