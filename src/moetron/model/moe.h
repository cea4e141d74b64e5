// DeepSeekMoE layer (DeepSeek-V3 report sec. 2.1.2, eq. 12-16) on one rank holding every expert:
//   logits = x Wg^T; s = sigmoid(logits); group-limited top-K of s + b (b: correction bias, for
//   selection only); w = normalized s of the chosen experts x routed_scaling_factor
//   out = sum_k w_k SwiGLU_{e_k}(x) + SwiGLU_shared(x)
// The routed experts run as one grouped GEMM over tokens sorted by expert (permute / unpermute).
//
// Also the sequence-wise balance loss (eq. 17-20), per sequence of T tokens:
//   f_i = E / (K T) sum_t 1[i in topk(t)],  s'_{i,t} = s_{i,t} / sum_j s_{j,t},
//   P_i = (1/T) sum_t s'_{i,t},  L = alpha sum_i f_i P_i,
// averaged over the micro-batch's sequences. Its gradient reaches s through P only (f counts).
#pragma once

#include <cstdint>
#include <string>

#include "moetron/model/mlp.h"
#include "moetron/model/params.h"

namespace moetron {

// Letters: E experts, K experts per token, F = moe_intermediate_size, Fs = n_shared_experts * F.
struct MoeParams {
    float* gate = nullptr;             // (E, D) router weight (HF mlp.gate.weight)
    float* correction_bias = nullptr;  // (E) e_score_correction_bias: selection only, not trained
    float* experts_gate_up = nullptr;  // (E, 2F, D): per expert [gate_proj; up_proj]
    float* experts_down = nullptr;     // (E, D, F)
    MlpParams shared;                  // (2Fs, D), (D, Fs); unset when n_shared_experts == 0
};

struct MoeActivations {
    float* scores = nullptr;            // (N, E) sigmoid scores s
    int32_t* topk_ids = nullptr;        // (N, K) chosen experts
    float* topk_weights = nullptr;      // (N, K) their gating weights
    int32_t* copy_to_row = nullptr;     // (N*K) where token copy t*K+j sits in expert order
    int64_t* expert_offsets = nullptr;  // (E + 1) row segments per expert
    float* permuted = nullptr;          // (N*K, D) expert inputs, sorted by expert
    float* expert_gate_up = nullptr;    // (N*K, 2F)
    float* expert_hidden = nullptr;     // (N*K, F)
    float* expert_out = nullptr;        // (N*K, D)
    float* load_fraction = nullptr;     // (B, E) f_i of eq. 18 per sequence
    MlpActivations shared;              // (N, 2Fs), (N, Fs)
};

// Temporaries shared by every MoE layer (they run one at a time).
struct MoeScratch {
    float* logits = nullptr;            // (N, E) router logits; their gradient in backward
    float* d_topk_weights = nullptr;    // (N, K)
    float* d_scores = nullptr;          // (N, E) the balance loss's gradient on s
    float* d_expert_out = nullptr;      // (N*K, D); later the gradient of the expert inputs
    float* d_expert_hidden = nullptr;   // (N*K, F)
    float* d_expert_gate_up = nullptr;  // (N*K, 2F)
};

void bind_moe_params(ParamBinder& b, MoeParams& p, const std::string& prefix, const ModelConfig& c);
void bind_moe_activations(BufferBinder& b, MoeActivations& a, const std::string& prefix,
                          const ModelConfig& c, int64_t batch, int64_t seq_len);
void bind_moe_scratch(BufferBinder& b, MoeScratch& s, const std::string& prefix,
                      const ModelConfig& c, int64_t num_tokens);

// out (N, D) written. When load_counts (E) is not null, the tokens routed to each expert are
// added to it. Returns alpha * (the balance loss averaged over the B sequences); 0 when alpha = 0.
double moe_forward(float* out, const MoeActivations& saved, int64_t* load_counts, const float* inp,
                   const MoeParams& w, const MoeScratch& scratch, const ModelConfig& c,
                   float balance_alpha, int64_t batch, int64_t seq_len);
// dinp (N, D) written; grads accumulate. balance_grad = d(total loss)/d(balance loss) times
// alpha (alpha * grad_scale); 0 skips the balance term.
void moe_backward(float* dinp, const MoeParams& grads, const float* dout, const float* inp,
                  const MoeActivations& saved, const MoeParams& w, const MoeScratch& scratch,
                  const MlpScratch& shared_scratch, const ModelConfig& c, float balance_grad,
                  int64_t batch, int64_t seq_len);

}  // namespace moetron
