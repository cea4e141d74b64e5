#include "moetron/model/block.h"

#include <algorithm>

#include "moetron/kernels/backend.h"

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
    const int64_t n = batch * seq_len, rows = n / tp_size, D = c.hidden_size;
    b(a.attn_norm_out, prefix + "attn_norm_out", {rows, D});
    b(a.attn_norm_rstd, prefix + "attn_norm_rstd", {rows});
    if (tp_size > 1) b(a.attn_in, prefix + "attn_in", {n, D});
    bind_mla_activations(b, a.attn, prefix + "attn.", c, tp_size, batch, seq_len);
    b(a.x_mid, prefix + "x_mid", {rows, D});
    b(a.mlp_norm_out, prefix + "mlp_norm_out", {rows, D});
    b(a.mlp_norm_rstd, prefix + "mlp_norm_rstd", {rows});
    if (tp_size > 1) b(a.mlp_in, prefix + "mlp_in", {n, D});
    if (is_moe) {
        bind_moe_activations(b, a.moe, prefix + "mlp.", c, tp_size, batch, seq_len);
    } else {
        bind_mlp_activations(b, a.mlp, prefix + "mlp.", n, c.intermediate_size / tp_size);
    }
}

void bind_block_scratch(BufferBinder& b, BlockScratch& s, const std::string& prefix,
                        const ModelConfig& c, int tp_size, int64_t num_tokens) {
    const int64_t D = c.hidden_size, rows = num_tokens / tp_size;
    b(s.branch, prefix + "branch", {rows, D});
    b(s.d_normed, prefix + "d_normed", {rows, D});
    if (tp_size > 1) {
        b(s.full, prefix + "full", {num_tokens, D});
        b(s.d_full, prefix + "d_full", {num_tokens, D});
        b(s.d_norm_weight, prefix + "d_norm_weight", {D});
    }
    bind_mla_scratch(b, s.attn, prefix + "attn.", c, tp_size, num_tokens);
    const int64_t shared_ffn = c.n_routed_experts > 0 ? shared_expert_ffn_dim(c, tp_size) : 0;
    bind_mlp_scratch(b, s.mlp, prefix + "mlp.", num_tokens,
                     std::max<int64_t>({c.intermediate_size / tp_size, shared_ffn, 1}));
    if (c.n_routed_experts > 0) bind_moe_scratch(b, s.moe, prefix + "moe.", c, tp_size, num_tokens);
}

void sequence_parallel_rmsnorm_backward(Backend& ops, float* dinp, float* dweight,
                                        const float* dout, const float* inp, const float* weight,
                                        const float* rstd, float* dweight_scratch, int64_t rows,
                                        int64_t dim, const parallel::TensorParallel& tp) {
    if (!tp.enabled()) {
        ops.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, dim);
        return;
    }
    ops.zero(dweight_scratch, static_cast<size_t>(dim) * sizeof(float));
    ops.rmsnorm_backward(dinp, dweight_scratch, dout, inp, weight, rstd, rows, dim);
    tp.sum_partial_param_grads(dweight_scratch, dim);
    ops.add_inplace(dweight, dweight_scratch, dim);
}

double block_forward(const ModelCompute& compute, float* x_out, const BlockActivations& saved,
                     const float* x_in, const BlockParams& w, const BlockScratch& scratch,
                     const RopeTables& rope, const ModelConfig& c,
                     const parallel::TensorParallel& tp, const BlockMoeOptions& moe, int64_t batch,
                     int64_t seq_len) {
    Backend& ops = compute.ops;
    const int64_t n = batch * seq_len, D = c.hidden_size, rows = tp.local_rows(n);
    const float eps = static_cast<float>(c.rms_norm_eps);
    // The split GEMMs' partial outputs over all N rows (the rows themselves with tp = 1).
    float* partial = tp.enabled() ? scratch.full : scratch.branch;

    ops.rmsnorm_forward(saved.attn_norm_out, saved.attn_norm_rstd, x_in, w.attn_norm, rows, D, eps);
    const float* attn_in = tp.gather_rows(saved.attn_in, saved.attn_norm_out, rows * D);
    mla_forward(compute, partial, saved.attn, attn_in, w.attn, scratch.attn, rope, c, tp, batch,
                seq_len);
    tp.reduce_scatter_rows(scratch.branch, partial, rows * D);  // o_proj is row-parallel
    ops.add(saved.x_mid, x_in, scratch.branch, rows * D);

    ops.rmsnorm_forward(saved.mlp_norm_out, saved.mlp_norm_rstd, saved.x_mid, w.mlp_norm, rows, D,
                        eps);
    const float* ffn_in = tp.gather_rows(saved.mlp_in, saved.mlp_norm_out, rows * D);
    double balance_loss = 0.0;
    if (w.is_moe) {
        balance_loss = moe_forward(compute, partial, saved.moe, moe.load_counts, ffn_in, w.moe,
                                   scratch.moe, c, tp, moe.balance_alpha, batch, seq_len);
    } else {
        mlp_forward(compute, partial, saved.mlp, ffn_in, w.mlp, n, D,
                    c.intermediate_size / tp.size(), false);
    }
    tp.reduce_scatter_rows(scratch.branch, partial, rows * D);  // down is row-parallel
    ops.add(x_out, saved.x_mid, scratch.branch, rows * D);
    return balance_loss;
}

void block_backward(const ModelCompute& compute, float* dx, const BlockParams& grads,
                    const float* x_in, const BlockActivations& saved, const BlockParams& w,
                    const BlockScratch& scratch, const RopeTables& rope, const ModelConfig& c,
                    const parallel::TensorParallel& tp, const BlockMoeOptions& moe, int64_t batch,
                    int64_t seq_len) {
    Backend& ops = compute.ops;
    const int64_t n = batch * seq_len, D = c.hidden_size, rows = tp.local_rows(n);
    const parallel::RowRange own = tp.row_share(n, "tokens of the micro-batch");
    const float* attn_in = tp.enabled() ? saved.attn_in : saved.attn_norm_out;
    const float* ffn_in = tp.enabled() ? saved.mlp_in : saved.mlp_norm_out;
    // The branch's input gradient over all N rows (the rows themselves with tp = 1).
    float* d_in = tp.enabled() ? scratch.d_full : scratch.branch;

    // FFN branch: dx (= d x_out) flows both into the branch and straight on to x_mid. Its input
    // gradient is partial over TP (column-parallel gate_up, each routed row from one rank).
    const float* dout = tp.gather_rows(scratch.full, dx, rows * D);
    if (w.is_moe) {
        moe_backward(compute, d_in, grads.moe, dout, ffn_in, saved.moe, w.moe, scratch.moe,
                     scratch.mlp, c, tp, moe.balance_grad, batch, seq_len);
    } else {
        mlp_backward(compute, d_in, grads.mlp, dout, ffn_in, saved.mlp, w.mlp, scratch.mlp, n, D,
                     c.intermediate_size / tp.size(), false);
    }
    tp.reduce_scatter_rows(scratch.branch, d_in, rows * D);
    sequence_parallel_rmsnorm_backward(ops, scratch.d_normed, grads.mlp_norm, scratch.branch,
                                       saved.x_mid, w.mlp_norm, saved.mlp_norm_rstd,
                                       scratch.d_norm_weight, rows, D, tp);
    ops.add_inplace(dx, scratch.d_normed, rows * D);

    // Attention branch: dx is now d x_mid. MLA's input gradient is whole on every TP rank
    // (attention_mla.h), so the rank's rows are a slice of it.
    dout = tp.gather_rows(scratch.full, dx, rows * D);
    mla_backward(compute, d_in, grads.attn, dout, attn_in, saved.attn, w.attn, scratch.attn, rope,
                 c, tp, batch, seq_len);
    const float* d_rows = tp.enabled() ? d_in + own.first * D : d_in;
    sequence_parallel_rmsnorm_backward(ops, scratch.d_normed, grads.attn_norm, d_rows, x_in,
                                       w.attn_norm, saved.attn_norm_rstd, scratch.d_norm_weight,
                                       rows, D, tp);
    ops.add_inplace(dx, scratch.d_normed, rows * D);
}

}  // namespace moetron
