// Parameter counts from the tensor shapes of DeepSeek-V3 (its Hugging Face modeling code), and
// FLOPs per token by Megatron-LM's num_floating_point_operations (megatron/training/training.py,
// transformer_flops with multi_latent_attention, MoE and mtp_num_layers), so that TFLOPs/GPU
// figures compare with NVIDIA's published ones.
#include "moetron/model/flops.h"

#include "moetron/core/error.h"

namespace moetron {

namespace {

double to_double(int64_t v) {
    return static_cast<double>(v);
}

// One SwiGLU MLP: gate and up (D -> F) and down (F -> D).
double swiglu_params(const ModelConfig& c, int64_t ffn) {
    return 3.0 * to_double(c.hidden_size) * to_double(ffn);
}

}  // namespace

LayerParamCounts count_layer_parameters(const ModelConfig& c, bool moe_layer) {
    const double hidden = to_double(c.hidden_size), heads = to_double(c.num_attention_heads);
    const double q_lora = to_double(c.q_lora_rank), kv_lora = to_double(c.kv_lora_rank);
    const double qk_head = to_double(c.qk_head_dim());

    LayerParamCounts p;
    // MLA (DeepSeek-V2 report sec. 2.1): q = W_qb norm(W_qa x) or W_q x; [c_kv, k_rope] = W_kva x;
    // [k_nope, v] = W_kvb norm(c_kv); out = W_o concat(heads).
    const double q_params = c.q_lora_rank > 0 ? hidden * q_lora + q_lora + q_lora * heads * qk_head
                                              : hidden * heads * qk_head;
    const double kv_params = hidden * (kv_lora + to_double(c.qk_rope_head_dim)) + kv_lora +
                             kv_lora * heads * to_double(c.qk_nope_head_dim + c.v_head_dim);
    const double o_params = heads * to_double(c.v_head_dim) * hidden;
    p.attention = q_params + kv_params + o_params;
    p.norms = 2.0 * hidden;
    if (moe_layer) {
        p.moe_shared = swiglu_params(c, c.n_shared_experts * c.moe_intermediate_size);
        p.moe_routed = to_double(c.n_routed_experts) * swiglu_params(c, c.moe_intermediate_size);
        // Sigmoid gate (E x D) and the aux-loss-free correction bias (E), DeepSeek-V3 sec. 2.1.2.
        p.router = to_double(c.n_routed_experts) * (hidden + 1.0);
    } else {
        p.dense_mlp = swiglu_params(c, c.intermediate_size);
    }
    return p;
}

namespace {

// The extra parts of one MTP module around its block (DeepSeek-V3 sec. 2.2): the projection
// M_k (D x 2D) of [RMSNorm(h); RMSNorm(Emb(t))], and three RMSNorms (enorm, hnorm, and the final
// norm before the shared output head: shared_head.norm in the checkpoint).
double mtp_projection_and_norm_params(const ModelConfig& c) {
    const double hidden = to_double(c.hidden_size);
    return 2.0 * hidden * hidden + 3.0 * hidden;
}

}  // namespace

double count_mtp_module_parameters(const ModelConfig& c, int64_t depth) {
    return mtp_projection_and_norm_params(c) +
           count_layer_parameters(c, c.mtp_layer_is_moe(depth)).total();
}

ParamCounts count_parameters(const ModelConfig& c) {
    const double hidden = to_double(c.hidden_size), vocab = to_double(c.vocab_size);
    const LayerParamCounts dense = count_layer_parameters(c, false);
    const LayerParamCounts moe = count_layer_parameters(c, true);
    const double num_moe = to_double(c.num_moe_layers());
    const double num_dense = to_double(c.num_dense_layers());

    ParamCounts p;
    p.embedding = vocab * hidden;
    p.output_head = c.tie_word_embeddings ? 0.0 : vocab * hidden;
    p.final_norm = hidden;
    p.attention = num_dense * dense.attention + num_moe * moe.attention;
    p.layer_norms = num_dense * dense.norms + num_moe * moe.norms;
    p.dense_mlp = num_dense * dense.dense_mlp;
    p.moe_shared = num_moe * moe.moe_shared;
    p.moe_routed = num_moe * moe.moe_routed;
    p.router = num_moe * moe.router;
    p.total = p.embedding + p.output_head + p.final_norm + p.attention + p.layer_norms +
              p.dense_mlp + p.moe_shared + p.moe_routed + p.router;
    p.routed_expert_single = swiglu_params(c, c.moe_intermediate_size);
    // A token runs K of the E routed experts of each MoE layer; everything else is dense.
    p.active = p.total - p.moe_routed +
               num_moe * to_double(c.num_experts_per_tok) * p.routed_expert_single;

    const int64_t num_mtp = c.num_nextn_predict_layers;
    const int64_t num_mtp_moe =
        c.num_moe_layers_in(c.num_hidden_layers, c.num_hidden_layers + num_mtp);
    p.mtp = to_double(num_mtp) * mtp_projection_and_norm_params(c) +
            to_double(num_mtp_moe) * moe.total() + to_double(num_mtp - num_mtp_moe) * dense.total();
    return p;
}

LayerFlopsPerToken layer_flops_per_token(const ModelConfig& c, int64_t seq_len, bool moe_layer) {
    MT_CHECK(seq_len > 0, "[flops] seq_len = {} must be positive", seq_len);
    constexpr double kScale = kForwardBackwardFactor * kFlopsPerMac;
    const LayerParamCounts params = count_layer_parameters(c, moe_layer);
    const double heads = to_double(c.num_attention_heads), seq = to_double(seq_len);

    LayerFlopsPerToken f;
    // Megatron counts every MLA projection weight and the two latent norms (its "+ 1" terms) as
    // one MAC per token: exactly the attention parameter count.
    f.attention_linear = kScale * params.attention;
    // QK^T over qk_head_dim and PV over v_head_dim, each S/2 keys on average under the causal mask.
    f.attention_core = kScale * (seq * heads * to_double(c.qk_head_dim()) / 2.0 +
                                 seq * heads * to_double(c.v_head_dim) / 2.0);
    f.dense_mlp = kScale * params.dense_mlp;
    f.moe_shared = kScale * params.moe_shared;
    // Only the K chosen experts run; the router GEMM is not counted (as in Megatron-LM).
    if (moe_layer) {
        f.moe_routed =
            kScale * to_double(c.num_experts_per_tok) * swiglu_params(c, c.moe_intermediate_size);
    }
    return f;
}

FlopsPerToken flops_per_token(const ModelConfig& c, int64_t seq_len, bool include_mtp) {
    constexpr double kScale = kForwardBackwardFactor * kFlopsPerMac;
    const double hidden = to_double(c.hidden_size), vocab = to_double(c.vocab_size);
    // Megatron-LM counts the output head at its padded vocabulary; moetron does not pad, and
    // DeepSeek-V3's 129,280 is already a multiple of 128.
    const double logits_per_head = kScale * hidden * vocab;

    FlopsPerToken f;
    const LayerFlopsPerToken dense = layer_flops_per_token(c, seq_len, false);
    const LayerFlopsPerToken moe = layer_flops_per_token(c, seq_len, true);
    const double num_moe = to_double(c.num_moe_layers());
    const double num_dense = to_double(c.num_dense_layers());
    f.attention_linear = num_dense * dense.attention_linear + num_moe * moe.attention_linear;
    f.attention_core = num_dense * dense.attention_core + num_moe * moe.attention_core;
    f.dense_mlp = num_dense * dense.dense_mlp;
    f.moe_shared = num_moe * moe.moe_shared;
    f.moe_routed = num_moe * moe.moe_routed;
    f.logits = logits_per_head;
    if (include_mtp) {
        const int64_t num_mtp = c.num_nextn_predict_layers;
        const int64_t num_mtp_moe =
            c.num_moe_layers_in(c.num_hidden_layers, c.num_hidden_layers + num_mtp);
        // Megatron-LM: "MTP eh norm + final norm" as 3 D and the eh projection as 2 D^2 MACs per
        // module, then one more transformer block and one more pass through the output head.
        f.mtp = to_double(num_mtp) *
                    (kScale * (3.0 * hidden + 2.0 * hidden * hidden) + logits_per_head) +
                to_double(num_mtp_moe) * moe.total() +
                to_double(num_mtp - num_mtp_moe) * dense.total();
    }
    f.total = f.attention_linear + f.attention_core + f.dense_mlp + f.moe_shared + f.moe_routed +
              f.logits + f.mtp;
    return f;
}

}  // namespace moetron
