// One pre-norm transformer block (DeepSeek-V3's decoder layer, HF DeepseekV3DecoderLayer):
//   x_mid = x_in + MLA(rmsnorm_attn(x_in))
//   x_out = x_mid + FFN(rmsnorm_mlp(x_mid))     FFN: dense SwiGLU MLP or the MoE layer
// Used for the main layers and for the block inside each MTP module.
//
// Tensor parallelism (tp > 1) with sequence parallelism (Korthikanti et al. 2022): the residual
// stream and the norms hold this rank's Nr = N/tp rows (tokens); before the attention and the
// FFN the normed rows are all-gathered into the whole N, and their outputs, partial sums over the
// TP ranks' heads or features (attention_mla.h, mlp.h, moe.h), are reduce-scattered back into
// the rows. The backward mirrors it. The norms' gains see only the rank's rows, so their
// gradients are summed over TP (sequence_parallel_rmsnorm_backward). With tp = 1, Nr = N and
// every gather or scatter is nothing.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/model/attention_mla.h"
#include "moetron/model/compute.h"
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
    float* attn_norm_out = nullptr;   // (Nr, D)
    float* attn_norm_rstd = nullptr;  // (Nr)
    float* attn_in = nullptr;         // (N, D) attn_norm_out of every TP rank (tp > 1 only)
    MlaActivations attn;
    float* x_mid = nullptr;          // (Nr, D) residual stream after attention
    float* mlp_norm_out = nullptr;   // (Nr, D)
    float* mlp_norm_rstd = nullptr;  // (Nr)
    float* mlp_in = nullptr;         // (N, D) mlp_norm_out of every TP rank (tp > 1 only)
    MlpActivations mlp;
    MoeActivations moe;
};

// Temporaries shared by every block (they run one at a time).
struct BlockScratch {
    float* branch = nullptr;    // (Nr, D) a branch's output in forward; its input grad in backward
    float* d_normed = nullptr;  // (Nr, D) the gradient through a norm, before it joins the stream
    // tp > 1 only: whole-N buffers around the split GEMMs, and a norm gain's partial gradient.
    float* full = nullptr;           // (N, D) partial outputs; the gathered output gradient
    float* d_full = nullptr;         // (N, D) the branch's input gradient over all N rows
    float* d_norm_weight = nullptr;  // (D)
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

// x_out (Nr, D) written from x_in (Nr, D), which the caller keeps for the backward: this rank's
// rows of the stream (all N with tp = 1). Returns the block's balance loss (alpha-weighted; 0 for
// a dense block), the same on every TP rank.
double block_forward(const ModelCompute& compute, float* x_out, const BlockActivations& saved,
                     const float* x_in, const BlockParams& w, const BlockScratch& scratch,
                     const RopeTables& rope, const ModelConfig& c,
                     const parallel::TensorParallel& tp, const BlockMoeOptions& moe, int64_t batch,
                     int64_t seq_len);
// dx (Nr, D): on entry the gradient on x_out, on return the gradient on x_in (the residual
// stream's gradient, updated in place). grads accumulate.
void block_backward(const ModelCompute& compute, float* dx, const BlockParams& grads,
                    const float* x_in, const BlockActivations& saved, const BlockParams& w,
                    const BlockScratch& scratch, const RopeTables& rope, const ModelConfig& c,
                    const parallel::TensorParallel& tp, const BlockMoeOptions& moe, int64_t batch,
                    int64_t seq_len);

// The rmsnorm_backward op on this rank's rows: dinp (rows, dim) written, dweight (dim) accumulates.
// With tp > 1 the gain's gradient from these rows is partial: it goes through dweight_scratch
// (dim floats), is summed over TP, then accumulates.
void sequence_parallel_rmsnorm_backward(Backend& ops, float* dinp, float* dweight,
                                        const float* dout, const float* inp, const float* weight,
                                        const float* rstd, float* dweight_scratch, int64_t rows,
                                        int64_t dim, const parallel::TensorParallel& tp);

}  // namespace moetron
