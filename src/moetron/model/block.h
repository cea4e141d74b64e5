// One pre-norm transformer block (DeepSeek-V3's decoder layer, HF DeepseekV3DecoderLayer):
//   x_mid = x_in + MLA(rmsnorm_attn(x_in))
//   x_out = x_mid + FFN(rmsnorm_mlp(x_mid))     FFN: dense SwiGLU MLP or the MoE layer
// Used for the main layers and for the block inside each MTP module.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/model/attention_mla.h"
#include "moetron/model/mlp.h"
#include "moetron/model/moe.h"

namespace moetron {

struct BlockParams {
    bool is_moe = false;
    float* attn_norm = nullptr;  // (D) HF input_layernorm
    MlaParams attn;
    float* mlp_norm = nullptr;  // (D) HF post_attention_layernorm
    MlpParams mlp;              // dense blocks
    MoeParams moe;              // MoE blocks
};

struct BlockActivations {
    float* attn_norm_out = nullptr;   // (N, D)
    float* attn_norm_rstd = nullptr;  // (N)
    MlaActivations attn;
    float* x_mid = nullptr;          // (N, D) residual stream after attention
    float* mlp_norm_out = nullptr;   // (N, D)
    float* mlp_norm_rstd = nullptr;  // (N)
    MlpActivations mlp;
    MoeActivations moe;
};

// Temporaries shared by every block (they run one at a time).
struct BlockScratch {
    float* branch = nullptr;    // (N, D) a branch's output in forward; its input grad in backward
    float* d_normed = nullptr;  // (N, D) the gradient through a norm, before it joins the stream
    MlaScratch attn;
    MlpScratch mlp;  // sized for the wider of the dense MLP and the shared experts
    MoeScratch moe;
};

// The per-call settings of the blocks' MoE parts.
struct BlockMoeOptions {
    int64_t* load_counts = nullptr;  // (E) tokens per expert added here when not null
    float balance_alpha = 0.0f;      // forward: the balance loss weight
    float balance_grad = 0.0f;       // backward: alpha * grad_scale
};

void bind_block_params(ParamBinder& b, BlockParams& p, const std::string& prefix,
                       const ModelConfig& c, bool is_moe);
void bind_block_activations(BufferBinder& b, BlockActivations& a, const std::string& prefix,
                            const ModelConfig& c, bool is_moe, int tp_size, int64_t batch,
                            int64_t seq_len);
void bind_block_scratch(BufferBinder& b, BlockScratch& s, const std::string& prefix,
                        const ModelConfig& c, int tp_size, int64_t num_tokens);

// x_out (N, D) written from x_in (N, D), which the caller keeps for the backward. Returns the
// block's balance loss (alpha-weighted; 0 for a dense block). With tensor parallelism (tp: the
// attention heads, the dense MLP and the shared experts split, attention_mla.h, mlp.h, moe.h)
// every TP rank holds the same x_in and gets the same x_out.
double block_forward(float* x_out, const BlockActivations& saved, const float* x_in,
                     const BlockParams& w, const BlockScratch& scratch, const RopeTables& rope,
                     const ModelConfig& c, const parallel::TensorParallel& tp,
                     const BlockMoeOptions& moe, int64_t batch, int64_t seq_len);
// dx: on entry the gradient on x_out, on return the gradient on x_in (the residual stream's
// gradient, updated in place). grads accumulate.
void block_backward(float* dx, const BlockParams& grads, const float* x_in,
                    const BlockActivations& saved, const BlockParams& w,
                    const BlockScratch& scratch, const RopeTables& rope, const ModelConfig& c,
                    const parallel::TensorParallel& tp, const BlockMoeOptions& moe, int64_t batch,
                    int64_t seq_len);

}  // namespace moetron
