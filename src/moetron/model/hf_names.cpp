#include "moetron/model/hf_names.h"

#include <cstring>
#include <utility>

#include "moetron/core/error.h"
#include "moetron/model/params.h"

namespace moetron {

namespace {

class MapBuilder {
  public:
    explicit MapBuilder(std::vector<HfTensor>& out) : out_(out) {}

    void add(std::string hf_name, Shape hf_shape, std::string param_name, int64_t offset = 0,
             bool alias = false) {
        out_.push_back({std::move(hf_name), hf_shape, std::move(param_name), offset, alias});
    }

    // A SwiGLU MLP stored as moetron's fused gate_up (2F, D) and down (D, F).
    void mlp(const std::string& hf, const std::string& ours, int64_t dim, int64_t ffn) {
        add(hf + "gate_proj.weight", {ffn, dim}, ours + "gate_up", 0);
        add(hf + "up_proj.weight", {ffn, dim}, ours + "gate_up", ffn * dim);
        add(hf + "down_proj.weight", {dim, ffn}, ours + "down", 0);
    }

    // One decoder layer: hf "model.layers.N.", ours "layers.N." or "mtp.d.".
    void block(const std::string& hf, const std::string& ours, const ModelConfig& c, bool is_moe,
               HfExpertLayout experts) {
        const int64_t D = c.hidden_size, H = c.num_attention_heads, Dqk = c.qk_head_dim();
        const int64_t C = c.kv_lora_rank, R = c.qk_rope_head_dim, Q = c.q_lora_rank;
        const std::string a = hf + "self_attn.", oa = ours + "attn.";
        add(hf + "input_layernorm.weight", {D}, ours + "attn_norm");
        if (Q > 0) {
            add(a + "q_a_proj.weight", {Q, D}, oa + "q_a_proj");
            add(a + "q_a_layernorm.weight", {Q}, oa + "q_a_norm");
            add(a + "q_b_proj.weight", {H * Dqk, Q}, oa + "q_b_proj");
        } else {
            add(a + "q_proj.weight", {H * Dqk, D}, oa + "q_proj");
        }
        add(a + "kv_a_proj_with_mqa.weight", {C + R, D}, oa + "kv_a_proj");
        add(a + "kv_a_layernorm.weight", {C}, oa + "kv_a_norm");
        add(a + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), C}, oa + "kv_b_proj");
        add(a + "o_proj.weight", {D, H * c.v_head_dim}, oa + "o_proj");
        add(hf + "post_attention_layernorm.weight", {D}, ours + "mlp_norm");

        const std::string m = hf + "mlp.", om = ours + "mlp.";
        if (!is_moe) {
            mlp(m, om, D, c.intermediate_size);
            return;
        }
        const int64_t E = c.n_routed_experts, F = c.moe_intermediate_size;
        add(m + "gate.weight", {E, D}, om + "router");
        add(m + "gate.e_score_correction_bias", {E}, om + "router_bias");
        if (experts == HfExpertLayout::fused) {
            add(m + "experts.gate_up_proj", {E, 2 * F, D}, om + "experts.gate_up");
            add(m + "experts.down_proj", {E, D, F}, om + "experts.down");
        } else {
            for (int64_t e = 0; e < E; ++e) {
                const std::string x = m + "experts." + std::to_string(e) + ".";
                add(x + "gate_proj.weight", {F, D}, om + "experts.gate_up", e * 2 * F * D);
                add(x + "up_proj.weight", {F, D}, om + "experts.gate_up", e * 2 * F * D + F * D);
                add(x + "down_proj.weight", {D, F}, om + "experts.down", e * D * F);
            }
        }
        if (c.n_shared_experts > 0)
            mlp(m + "shared_experts.", om + "shared.", D, c.n_shared_experts * F);
    }

  private:
    std::vector<HfTensor>& out_;
};

}  // namespace

HfNameMap::HfNameMap(const ModelConfig& c, HfExpertLayout experts) {
    const int64_t V = c.vocab_size, D = c.hidden_size;
    MapBuilder b(tensors_);
    b.add("model.embed_tokens.weight", {V, D}, "embed");
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        b.block("model.layers." + std::to_string(l) + ".", main_layer_prefix(l), c,
                c.is_moe_layer(l), experts);
    }
    b.add("model.norm.weight", {D}, "final_norm");
    b.add("lm_head.weight", {V, D}, "head");
    for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d) {
        const std::string hf = "model.layers." + std::to_string(c.num_hidden_layers + d) + ".";
        const std::string ours = mtp_prefix(d);
        b.add(hf + "enorm.weight", {D}, ours + "emb_norm");
        b.add(hf + "hnorm.weight", {D}, ours + "hidden_norm");
        b.add(hf + "eh_proj.weight", {D, 2 * D}, ours + "eh_proj");
        b.block(hf, ours, c, c.mtp_layer_is_moe(d), experts);
        b.add(hf + "shared_head.norm.weight", {D}, ours + "final_norm");
        b.add(hf + "embed_tokens.weight", {V, D}, "embed", 0, true);
        b.add(hf + "shared_head.head.weight", {V, D}, "head", 0, true);
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
        MT_CHECK(index_.emplace(tensors_[i].hf_name, i).second, "[hf_names] '{}' mapped twice",
                 tensors_[i].hf_name);
    }
}

const HfTensor* HfNameMap::find(std::string_view hf_name) const {
    auto it = index_.find(std::string(hf_name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

const HfTensor& HfNameMap::at(std::string_view hf_name) const {
    const HfTensor* t = find(hf_name);
    MT_CHECK(t != nullptr, "[hf_names] '{}' is not a DeepSeek-V3 tensor of this model config",
             hf_name);
    return *t;
}

void copy_hf_to_param(float* param, const HfTensor& hf, const float* hf_data) {
    std::memcpy(param + hf.param_offset, hf_data, static_cast<size_t>(hf.numel()) * sizeof(float));
}

void copy_param_to_hf(float* hf_data, const HfTensor& hf, const float* param) {
    std::memcpy(hf_data, param + hf.param_offset, static_cast<size_t>(hf.numel()) * sizeof(float));
}

}  // namespace moetron
