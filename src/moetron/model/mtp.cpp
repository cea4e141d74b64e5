#include "moetron/model/mtp.h"

#include "moetron/kernels/backend.h"
#include "moetron/model/vocab_parallel.h"

namespace moetron {

namespace {

// Positions past the end of a sequence: Megatron-LM's roll pads the input with token 0 and masks
// the target.
constexpr int32_t kPastEndToken = 0;
constexpr int32_t kIgnoreTarget = -1;

// Copies a contiguous (N, width) buffer into one half of a (N, 2 * width) one, and back.
void copy_into_half(Backend& ops, float* wide, const float* narrow, int64_t num_rows, int64_t width,
                    int64_t half) {
    ops.copy_rows_strided(wide + half * width, narrow, num_rows, width, 2 * width, width);
}

void copy_from_half(Backend& ops, float* narrow, const float* wide, int64_t num_rows, int64_t width,
                    int64_t half) {
    ops.copy_rows_strided(narrow, wide + half * width, num_rows, width, width, 2 * width);
}

}  // namespace

void bind_mtp_params(ParamBinder& b, MtpParams& p, const std::string& prefix, const ModelConfig& c,
                     int64_t depth) {
    const int64_t D = c.hidden_size;
    b.norm(p.emb_norm, prefix + "emb_norm", D);
    b.norm(p.hidden_norm, prefix + "hidden_norm", D);
    b.weight(p.eh_proj, prefix + "eh_proj", {D, 2 * D});
    bind_block_params(b, p.block, prefix, c, c.mtp_layer_is_moe(depth));
    b.norm(p.final_norm, prefix + "final_norm", D);
}

void bind_mtp_activations(BufferBinder& b, MtpActivations& a, const std::string& prefix,
                          const ModelConfig& c, int64_t depth, int tp_size, int64_t batch,
                          int64_t seq_len) {
    const int64_t n = batch * seq_len, rows = n / tp_size, D = c.hidden_size;
    b(a.input_tokens, prefix + "input_tokens", {n});
    b(a.targets, prefix + "targets", {n});
    b(a.emb, prefix + "emb", {rows, D});
    b(a.emb_rstd, prefix + "emb_rstd", {rows});
    b(a.hidden_rstd, prefix + "hidden_rstd", {rows});
    b(a.concat, prefix + "concat", {rows, 2 * D});
    b(a.block_in, prefix + "block_in", {rows, D});
    bind_block_activations(b, a.block, prefix, c, c.mtp_layer_is_moe(depth), tp_size, batch,
                           seq_len);
    b(a.out, prefix + "out", {rows, D});
    b(a.d_out, prefix + "d_out", {rows, D});
}

void bind_mtp_scratch(BufferBinder& b, MtpScratch& s, const std::string& prefix,
                      const ModelConfig& c, int tp_size, int64_t num_tokens) {
    const int64_t D = c.hidden_size, rows = num_tokens / tp_size;
    b(s.normed, prefix + "normed", {rows, D});
    b(s.d_concat, prefix + "d_concat", {rows, 2 * D});
    b(s.d_emb, prefix + "d_emb", {rows, D});
    if (tp_size > 1) b(s.d_eh_proj, prefix + "d_eh_proj", {D, 2 * D});
}

double mtp_forward(const ModelCompute& compute, const MtpActivations& saved, const float* h_prev,
                   const int32_t* tokens, const int32_t* targets, const float* embedding,
                   const MtpParams& w, const MtpScratch& scratch, const BlockScratch& block_scratch,
                   const RopeTables& rope, const ModelConfig& c, const parallel::TensorParallel& tp,
                   const BlockMoeOptions& moe, int64_t depth, int64_t batch, int64_t seq_len) {
    Backend& ops = compute.ops;
    const GemmPrecision layer = compute.gemm(GemmRole::layer);
    const int64_t n = batch * seq_len, D = c.hidden_size, shift = depth + 1;
    const int64_t rows = tp.local_rows(n);
    const float eps = static_cast<float>(c.rms_norm_eps);

    ops.shift_sequences(saved.input_tokens, tokens, batch, seq_len, shift, kPastEndToken);
    ops.shift_sequences(saved.targets, targets, batch, seq_len, shift, kIgnoreTarget);

    vocab_parallel_embedding_forward(ops, saved.emb, saved.input_tokens, embedding,
                                     block_scratch.full, n, c.vocab_size, D, tp);
    ops.rmsnorm_forward(scratch.normed, saved.emb_rstd, saved.emb, w.emb_norm, rows, D, eps);
    copy_into_half(ops, saved.concat, scratch.normed, rows, D, 0);
    ops.rmsnorm_forward(scratch.normed, saved.hidden_rstd, h_prev, w.hidden_norm, rows, D, eps);
    copy_into_half(ops, saved.concat, scratch.normed, rows, D, 1);
    ops.linear_forward(saved.block_in, saved.concat, w.eh_proj, rows, 2 * D, D, layer);

    return block_forward(compute, saved.out, saved.block, saved.block_in, w.block, block_scratch,
                         rope, c, tp, moe, batch, seq_len);
}

void mtp_backward(const ModelCompute& compute, float* d_h_prev, const MtpParams& grads,
                  float* embedding_grad, const float* h_prev, const MtpActivations& saved,
                  const MtpParams& w, const MtpScratch& scratch, const BlockScratch& block_scratch,
                  const RopeTables& rope, const ModelConfig& c, const parallel::TensorParallel& tp,
                  const BlockMoeOptions& moe, int64_t batch, int64_t seq_len) {
    Backend& ops = compute.ops;
    const GemmPrecision layer = compute.gemm(GemmRole::layer);
    const int64_t n = batch * seq_len, D = c.hidden_size, rows = tp.local_rows(n);

    float* dx = saved.d_out;
    block_backward(compute, dx, grads.block, saved.block_in, saved.block, w.block, block_scratch,
                   rope, c, tp, moe, batch, seq_len);
    // eh_proj is replicated but sees only this rank's rows under TP: its gradient is partial.
    float* d_eh_proj = tp.enabled() ? scratch.d_eh_proj : grads.eh_proj;
    if (tp.enabled()) ops.zero(d_eh_proj, static_cast<size_t>(2 * D * D) * sizeof(float));
    ops.linear_backward(scratch.d_concat, d_eh_proj, dx, saved.concat, w.eh_proj, rows, 2 * D, D,
                        layer);
    if (tp.enabled()) {
        tp.sum_partial_param_grads(d_eh_proj, 2 * D * D);
        ops.add_inplace(grads.eh_proj, d_eh_proj, 2 * D * D);
    }

    float* d_half = scratch.normed;
    copy_from_half(ops, d_half, scratch.d_concat, rows, D, 0);
    sequence_parallel_rmsnorm_backward(ops, scratch.d_emb, grads.emb_norm, d_half, saved.emb,
                                       w.emb_norm, saved.emb_rstd, block_scratch.d_norm_weight,
                                       rows, D, tp);
    vocab_parallel_embedding_backward(ops, embedding_grad, scratch.d_emb, saved.input_tokens,
                                      block_scratch.full, n, c.vocab_size, D, tp);

    copy_from_half(ops, d_half, scratch.d_concat, rows, D, 1);
    sequence_parallel_rmsnorm_backward(ops, d_h_prev, grads.hidden_norm, d_half, h_prev,
                                       w.hidden_norm, saved.hidden_rstd,
                                       block_scratch.d_norm_weight, rows, D, tp);
}

}  // namespace moetron
