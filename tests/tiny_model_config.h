// The tiny model (configs/models/tiny.toml: every DeepSeek-V3 feature on), written out so that a
// test does not depend on the preset file.
#pragma once

#include "moetron/model/config.h"

namespace moetron::testing {

inline ModelConfig tiny_model_config() {
    ModelConfig c;
    c.name = "tiny-test";
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.num_hidden_layers = 3;
    c.first_k_dense_replace = 1;
    c.intermediate_size = 128;
    c.moe_intermediate_size = 32;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 2;
    c.n_group = 4;
    c.topk_group = 2;
    c.routed_scaling_factor = 2.5;
    c.num_attention_heads = 4;
    c.q_lora_rank = 32;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.max_position_embeddings = 256;
    c.num_nextn_predict_layers = 1;
    return c;
}

}  // namespace moetron::testing
