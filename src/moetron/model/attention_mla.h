// Multi-head latent attention (DeepSeek-V2 report sec. 2.1, DeepSeek-V3 report eq. 1-11), as the
// Hugging Face DeepseekV3Attention computes it:
//   q      = q_b_proj(rmsnorm(q_a_proj(x)))      or q_proj(x) when q_lora_rank == 0   (N, H, Dqk)
//            per head [q_nope (qk_nope_head_dim) | q_rope (R)]
//   [c, kr] = kv_a_proj_with_mqa(x)              latent c (kv_lora_rank), shared rope key kr (R)
//   kv     = kv_b_proj(rmsnorm(c))               per head [k_nope | v]
//   RoPE on q_rope and kr (HF's interleaved layout, kernels/cpu/rope.h); k = [k_nope | kr] per head
//   out    = o_proj(causal_attention(q, k, v, scale = qk_head_dim^-0.5))       (no YaRN scaling)
//
// Tensor parallelism (Megatron style) splits the heads: q_b_proj (or q_proj) and kv_b_proj are
// column-parallel by heads, o_proj row-parallel, and the attention runs on the rank's H/tp heads.
// The low-rank down-projections (q_a_proj, kv_a_proj_with_mqa) and their norms stay replicated:
// every TP rank sees the same tokens, so they get identical gradients (summed over DP only).
// Communication: o_proj's outputs are partial sums over the ranks' heads, reduced by the caller
// (block.h); in the backward, the gradients of the inputs of the split GEMMs (the normed latents,
// the shared rope key; x itself when q_lora_rank == 0) are partial sums over the rank's heads and
// are all-reduced (f), so that the input gradient comes out whole on every TP rank.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/kernels/backend.h"
#include "moetron/model/compute.h"
#include "moetron/model/params.h"
#include "moetron/parallel/tensor_parallel.h"

namespace moetron {

// HF's q_a_layernorm and kv_a_layernorm keep DeepseekV3RMSNorm's default eps (1e-6), not
// rms_norm_eps; DeepSeek's own inference code does the same.
inline constexpr float kMlaLatentNormEps = 1e-6f;

// Letters: Q = q_lora_rank, C = kv_lora_rank, Dn = qk_nope_head_dim, R = qk_rope_head_dim,
// Dqk = Dn + R, Dv = v_head_dim. H below is the rank's heads: num_attention_heads / tp.
struct MlaParams {
    float* q_a_proj = nullptr;   // (Q, D)            when q_lora_rank > 0
    float* q_a_norm = nullptr;   // (Q)               when q_lora_rank > 0
    float* q_b_proj = nullptr;   // (H*Dqk, Q)        when q_lora_rank > 0
    float* q_proj = nullptr;     // (H*Dqk, D)        when q_lora_rank == 0
    float* kv_a_proj = nullptr;  // (C + R, D): rows [0, C) the latent, [C, C+R) the rope key
    float* kv_a_norm = nullptr;  // (C)
    float* kv_b_proj = nullptr;  // (H*(Dn+Dv), C): per head [k_nope | v]
    float* o_proj = nullptr;     // (D, H*Dv)
};

struct MlaActivations {
    float* q_a = nullptr;            // (N, Q) before its norm     (q_lora_rank > 0)
    float* q_a_rstd = nullptr;       // (N)
    float* q_a_normed = nullptr;     // (N, Q)
    float* q = nullptr;              // (N, H, Dqk) after RoPE
    float* latent = nullptr;         // (N, C) before its norm
    float* latent_rstd = nullptr;    // (N)
    float* latent_normed = nullptr;  // (N, C)
    float* k = nullptr;              // (N, H, Dqk) [k_nope | rotated shared rope key]
    float* v = nullptr;              // (N, H, Dv)
    float* attn = nullptr;           // (N, H, Dv) attention output, o_proj's input
    float* lse = nullptr;            // (B, H, S) softmax log-sum-exp per score row
};

// Temporaries shared by every MLA layer (they run one at a time).
struct MlaScratch {
    float* kv = nullptr;               // (N, H, Dn+Dv) kv_b_proj output; its gradient in backward
    float* k_rope = nullptr;           // (N, R) the shared rope key; its gradient in backward
    float* d_attn = nullptr;           // (N, H*Dv)
    float* dq = nullptr;               // (N, H, Dqk)
    float* dk = nullptr;               // (N, H, Dqk)
    float* dv = nullptr;               // (N, H, Dv)
    float* d_q_a_normed = nullptr;     // (N, Q)
    float* d_q_a = nullptr;            // (N, Q)
    float* d_latent_normed = nullptr;  // (N, C)
    float* d_latent = nullptr;         // (N, C)
};

// cos, sin (S_max, R/2) from the rope_tables op.
struct RopeTables {
    const float* cos = nullptr;
    const float* sin = nullptr;
};

// The binder's tensor-parallel setting splits the heads; tp_size must be the same.
void bind_mla_params(ParamBinder& b, MlaParams& p, const std::string& prefix, const ModelConfig& c);
void bind_mla_activations(BufferBinder& b, MlaActivations& a, const std::string& prefix,
                          const ModelConfig& c, int tp_size, int64_t batch, int64_t seq_len);
void bind_mla_scratch(BufferBinder& b, MlaScratch& s, const std::string& prefix,
                      const ModelConfig& c, int tp_size, int64_t num_tokens);

// out (N, D) written: this rank's partial sum (the whole output with tp = 1); inp (N, D) is the
// normed residual stream, the same on every TP rank, kept by the caller.
void mla_forward(const ModelCompute& compute, float* out, const MlaActivations& saved,
                 const float* inp, const MlaParams& w, const MlaScratch& scratch,
                 const RopeTables& rope, const ModelConfig& c, const parallel::TensorParallel& tp,
                 int64_t batch, int64_t seq_len);
// dinp (N, D) written (the full gradient on every TP rank); grads accumulate.
void mla_backward(const ModelCompute& compute, float* dinp, const MlaParams& grads,
                  const float* dout, const float* inp, const MlaActivations& saved,
                  const MlaParams& w, const MlaScratch& scratch, const RopeTables& rope,
                  const ModelConfig& c, const parallel::TensorParallel& tp, int64_t batch,
                  int64_t seq_len);

}  // namespace moetron
