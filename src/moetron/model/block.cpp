#include "moetron/model/block.h"

#include <algorithm>

#include "moetron/kernels/cpu/elementwise.h"
#include "moetron/kernels/cpu/rmsnorm.h"

namespace moetron {

void bind_block_params(ParamBinder& b, BlockParams& p, const std::string& prefix,
                       const ModelConfig& c, bool is_moe) {
    p.is_moe = is_moe;
    b.norm(p.attn_norm, prefix + "attn_norm", c.hidden_size);
    bind_mla_params(b, p.attn, prefix + "attn.", c);
    b.norm(p.mlp_norm, prefix + "mlp_norm", c.hidden_size);
    if (is_moe) {
        bind_moe_params(b, p.moe, prefix + "mlp.", c);
    } else {
        bind_mlp_params(b, p.mlp, prefix + "mlp.", c.hidden_size, c.intermediate_size);
    }
}

void bind_block_activations(BufferBinder& b, BlockActivations& a, const std::string& prefix,
                            const ModelConfig& c, bool is_moe, int tp_size, int64_t batch,
                            int64_t seq_len) {
    const int64_t n = batch * seq_len, D = c.hidden_size;
    b(a.attn_norm_out, prefix + "attn_norm_out", {n, D});
    b(a.attn_norm_rstd, prefix + "attn_norm_rstd", {n});
    bind_mla_activations(b, a.attn, prefix + "attn.", c, tp_size, batch, seq_len);
    b(a.x_mid, prefix + "x_mid", {n, D});
    b(a.mlp_norm_out, prefix + "mlp_norm_out", {n, D});
    b(a.mlp_norm_rstd, prefix + "mlp_norm_rstd", {n});
    if (is_moe) {
        bind_moe_activations(b, a.moe, prefix + "mlp.", c, tp_size, batch, seq_len);
    } else {
        bind_mlp_activations(b, a.mlp, prefix + "mlp.", n, c.intermediate_size / tp_size);
    }
}

void bind_block_scratch(BufferBinder& b, BlockScratch& s, const std::string& prefix,
                        const ModelConfig& c, int tp_size, int64_t num_tokens) {
    const int64_t D = c.hidden_size;
    b(s.branch, prefix + "branch", {num_tokens, D});
    b(s.d_normed, prefix + "d_normed", {num_tokens, D});
    bind_mla_scratch(b, s.attn, prefix + "attn.", c, tp_size, num_tokens);
    const int64_t shared_ffn = c.n_routed_experts > 0 ? shared_expert_ffn_dim(c, tp_size) : 0;
    bind_mlp_scratch(b, s.mlp, prefix + "mlp.", num_tokens,
                     std::max<int64_t>({c.intermediate_size / tp_size, shared_ffn, 1}));
    if (c.n_routed_experts > 0) bind_moe_scratch(b, s.moe, prefix + "moe.", c, tp_size, num_tokens);
}

double block_forward(float* x_out, const BlockActivations& saved, const float* x_in,
                     const BlockParams& w, const BlockScratch& scratch, const RopeTables& rope,
                     const ModelConfig& c, const parallel::TensorParallel& tp,
                     const BlockMoeOptions& moe, int64_t batch, int64_t seq_len) {
    const int64_t n = batch * seq_len, D = c.hidden_size;
    const float eps = static_cast<float>(c.rms_norm_eps);

    cpu::rmsnorm_forward(saved.attn_norm_out, saved.attn_norm_rstd, x_in, w.attn_norm, n, D, eps);
    mla_forward(scratch.branch, saved.attn, saved.attn_norm_out, w.attn, scratch.attn, rope, c, tp,
                batch, seq_len);
    cpu::add(saved.x_mid, x_in, scratch.branch, n * D);

    cpu::rmsnorm_forward(saved.mlp_norm_out, saved.mlp_norm_rstd, saved.x_mid, w.mlp_norm, n, D,
                         eps);
    double balance_loss = 0.0;
    if (w.is_moe) {
        balance_loss = moe_forward(scratch.branch, saved.moe, moe.load_counts, saved.mlp_norm_out,
                                   w.moe, scratch.moe, c, tp, moe.balance_alpha, batch, seq_len);
    } else {
        mlp_forward(scratch.branch, saved.mlp, saved.mlp_norm_out, w.mlp, n, D,
                    c.intermediate_size / tp.size(), false);
        tp.sum_partial_outputs(scratch.branch, n * D);  // g: down is row-parallel
    }
    cpu::add(x_out, saved.x_mid, scratch.branch, n * D);
    return balance_loss;
}

void block_backward(float* dx, const BlockParams& grads, const float* x_in,
                    const BlockActivations& saved, const BlockParams& w,
                    const BlockScratch& scratch, const RopeTables& rope, const ModelConfig& c,
                    const parallel::TensorParallel& tp, const BlockMoeOptions& moe, int64_t batch,
                    int64_t seq_len) {
    const int64_t n = batch * seq_len, D = c.hidden_size;

    // FFN branch: dx (= d x_out) flows both into the branch and straight on to x_mid.
    if (w.is_moe) {
        moe_backward(scratch.branch, grads.moe, dx, saved.mlp_norm_out, saved.moe, w.moe,
                     scratch.moe, scratch.mlp, c, tp, moe.balance_grad, batch, seq_len);
    } else {
        mlp_backward(scratch.branch, grads.mlp, dx, saved.mlp_norm_out, saved.mlp, w.mlp,
                     scratch.mlp, n, D, c.intermediate_size / tp.size(), false);
        tp.sum_partial_input_grads(scratch.branch, n * D);  // f: gate_up is column-parallel
    }
    cpu::rmsnorm_backward(scratch.d_normed, grads.mlp_norm, scratch.branch, saved.x_mid, w.mlp_norm,
                          saved.mlp_norm_rstd, n, D);
    cpu::add_inplace(dx, scratch.d_normed, n * D);

    // Attention branch: dx is now d x_mid.
    mla_backward(scratch.branch, grads.attn, dx, saved.attn_norm_out, saved.attn, w.attn,
                 scratch.attn, rope, c, tp, batch, seq_len);
    cpu::rmsnorm_backward(scratch.d_normed, grads.attn_norm, scratch.branch, x_in, w.attn_norm,
                          saved.attn_norm_rstd, n, D);
    cpu::add_inplace(dx, scratch.d_normed, n * D);
}

}  // namespace moetron
