// Multi-token prediction module (DeepSeek-V3 report sec. 2.2, eq. 21-25). Depth d = 1..D_mtp
// predicts the token d+1 places ahead of each position:
//   h'_d  = eh_proj([rmsnorm_e(Emb(token t+d)); rmsnorm_h(h_{d-1} at t)])       (eq. 21, emb first
//           as in DeepSeek-V3's code; h_0 is the main model's last hidden state before its norm)
//   h_d   = TransformerBlock_d(h'_d)                                             (eq. 22)
//   logits = OutHead(rmsnorm_final(h_d)), cross-entropy against token t+1+d      (eq. 23-24)
// The embedding and the output head are the main model's (shared). Within each sequence the
// inputs and targets shift by d; positions past the sequence end read token 0 and have no target
// (as Megatron-LM's roll), so they affect nothing but their own unused outputs and the routing
// statistics. This module holds everything up to h_d; the model runs the norm, head and loss.
// With tensor parallelism the module works on this rank's token rows (sequence parallelism,
// block.h); the embedding is vocabulary-parallel, and eh_proj and the norms, replicated but fed
// only those rows, have their gradients summed over TP.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/model/block.h"
#include "moetron/model/compute.h"

namespace moetron {

struct MtpParams {
    float* emb_norm = nullptr;     // (D) HF enorm
    float* hidden_norm = nullptr;  // (D) HF hnorm
    float* eh_proj = nullptr;      // (D, 2D) over [rmsnorm_e(emb) | rmsnorm_h(h)]
    BlockParams block;
    float* final_norm = nullptr;  // (D) HF shared_head.norm
};

struct MtpActivations {
    int32_t* input_tokens = nullptr;  // (N) token t+d of each position, 0 past the sequence end
    int32_t* targets = nullptr;       // (N) target t+d (token t+1+d), -1 past the sequence end
    // Nr: this rank's token rows, N/tp (sequence parallelism, block.h).
    float* emb = nullptr;          // (Nr, D) Emb(input_tokens)
    float* emb_rstd = nullptr;     // (Nr)
    float* hidden_rstd = nullptr;  // (Nr)
    float* concat = nullptr;       // (Nr, 2D) eh_proj's input
    float* block_in = nullptr;     // (Nr, D) h'_d
    BlockActivations block;
    float* out = nullptr;    // (Nr, D) h_d, the next depth's h_{d-1}
    float* d_out = nullptr;  // (Nr, D) gradient on h_d: this depth's loss, then the next depth's
};

// Temporaries shared by the MTP modules (they run one at a time).
struct MtpScratch {
    float* normed = nullptr;    // (Nr, D) a normed half of concat; its gradient in backward
    float* d_concat = nullptr;  // (Nr, 2D)
    float* d_emb = nullptr;     // (Nr, D)
    // tp > 1 only: eh_proj's gradient from this rank's rows, summed over TP before it
    // accumulates (eh_proj is replicated and, under sequence parallelism, sees only those rows).
    float* d_eh_proj = nullptr;  // (D, 2D)
};

void bind_mtp_params(ParamBinder& b, MtpParams& p, const std::string& prefix, const ModelConfig& c,
                     int64_t depth);
void bind_mtp_activations(BufferBinder& b, MtpActivations& a, const std::string& prefix,
                          const ModelConfig& c, int64_t depth, int tp_size, int64_t batch,
                          int64_t seq_len);
void bind_mtp_scratch(BufferBinder& b, MtpScratch& s, const std::string& prefix,
                      const ModelConfig& c, int tp_size, int64_t num_tokens);

// depth is 0-based (shift d = depth + 1). tokens, targets (B, S) are the main model's; h_prev
// (Nr, D: this rank's rows) is kept by the caller; embedding is the (vocabulary-parallel) table.
// Fills saved (saved.out = h_d). Returns the block's balance loss.
double mtp_forward(const ModelCompute& compute, const MtpActivations& saved, const float* h_prev,
                   const int32_t* tokens, const int32_t* targets, const float* embedding,
                   const MtpParams& w, const MtpScratch& scratch, const BlockScratch& block_scratch,
                   const RopeTables& rope, const ModelConfig& c, const parallel::TensorParallel& tp,
                   const BlockMoeOptions& moe, int64_t depth, int64_t batch, int64_t seq_len);
// Consumes saved.d_out (overwritten as the running residual gradient). d_h_prev (Nr, D) written;
// grads and embedding_grad (V, D; this rank's V/tp rows under TP) accumulate.
void mtp_backward(const ModelCompute& compute, float* d_h_prev, const MtpParams& grads,
                  float* embedding_grad, const float* h_prev, const MtpActivations& saved,
                  const MtpParams& w, const MtpScratch& scratch, const BlockScratch& block_scratch,
                  const RopeTables& rope, const ModelConfig& c, const parallel::TensorParallel& tp,
                  const BlockMoeOptions& moe, int64_t batch, int64_t seq_len);

}  // namespace moetron
