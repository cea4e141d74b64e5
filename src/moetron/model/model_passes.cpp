// A micro-batch's forward and backward through the chunks of the model this rank runs, the head
// with its loss that the main model and the MTP depths share, and the loss denominators.
//
// Order of one forward_backward:
//   forward: embedding, main blocks; per MTP depth its module, then its head and loss with the
//     head's backward right away (the (N, V) logits buffer is then free for the next head, so one
//     suffices); then the main head, loss and head backward.
//   backward: MTP depths in reverse (each adds its gradient on h_{d-1} to the previous depth's, or
//     the main stream's), main blocks in reverse, embedding.
// With a GradReadyCallback, each parameter group is announced as soon as its gradient is final:
// the head and final norm after the main head's backward, each MTP module and main block after its
// backward, the embedding last.
#include "moetron/model/model_impl.h"

#include <algorithm>

#include "moetron/kernels/backend.h"

namespace moetron {

namespace {

constexpr int32_t kIgnoreIndex = -1;

// Cross-entropy of head(rmsnorm(hidden)) against targets (N). When d_hidden is not null, also the
// backward of loss_grad * (loss sum / denominator), denominator <= 0 meaning this call's valid
// count (its mean): d_hidden written; the norm's and head's gradients accumulate. hidden and
// d_hidden are this rank's (Nr, D) rows; with tensor parallelism the normed rows are all-gathered
// for the head, and the head and the cross-entropy are vocabulary-parallel (vocab_parallel.h).
CrossEntropyResult head_loss(const ModelCompute& compute, float* d_hidden, const float* hidden,
                             const int32_t* targets, const float* norm_w, float* norm_g,
                             const float* head_w, float* head_g, const HeadScratch& s,
                             const ModelConfig& c, const parallel::TensorParallel& tp, int64_t n,
                             float loss_grad, int64_t denominator) {
    Backend& ops = compute.ops;
    const GemmPrecision head = compute.gemm(GemmRole::head);
    const int64_t D = c.hidden_size, V = c.vocab_size, Vp = V / tp.size();
    const int64_t rows = tp.local_rows(n);
    ops.rmsnorm_forward(s.normed, s.rstd, hidden, norm_w, rows, D,
                        static_cast<float>(c.rms_norm_eps));
    const float* normed = tp.gather_rows(s.normed_full, s.normed, rows * D);
    // bfloat16 under the bf16 recipe, float32 under the FP8 ones (compute.h).
    ops.linear_forward(s.logits, normed, head_w, n, D, Vp, head);
    const CrossEntropyResult ce = vocab_parallel_cross_entropy_forward(
        ops, s.losses, s.lse, s.logits, targets, s.vocab, n, V, kIgnoreIndex, tp);
    if (d_hidden == nullptr) return ce;

    const int64_t count = denominator > 0 ? denominator : ce.num_valid;
    const float per_token = count > 0 ? loss_grad / static_cast<float>(count) : 0.0f;
    vocab_parallel_cross_entropy_backward(ops, s.logits, s.logits, s.lse, targets, n, V,
                                          kIgnoreIndex, per_token, tp);
    // The head is column-parallel over the vocabulary: its input gradient is partial over TP.
    float* d_normed = tp.enabled() ? s.d_normed_full : s.d_normed;
    // Whole under a split backward (compute.h).
    compute.whole_backward.linear_backward(d_normed, head_g, s.logits, normed, head_w, n, D, Vp,
                                           head);
    tp.reduce_scatter_rows(s.d_normed, d_normed, rows * D);
    sequence_parallel_rmsnorm_backward(ops, d_hidden, norm_g, s.d_normed, hidden, norm_w, s.rstd,
                                       s.d_norm_weight, rows, D, tp);
    return ce;
}

}  // namespace

LossDenominators& LossDenominators::operator+=(const LossDenominators& other) {
    lm_tokens += other.lm_tokens;
    for (size_t d = 0; d < mtp_tokens.size(); ++d) mtp_tokens[d] += other.mtp_tokens[d];
    sequences += other.sequences;
    return *this;
}

LossDenominators count_loss_denominators(const ModelConfig& config, const int32_t* targets,
                                         int64_t batch, int64_t seq_len) {
    MT_CHECK(config.num_nextn_predict_layers <= kMaxMtpDepths,
             "[model] {} MTP depths; loss denominators hold at most {}",
             config.num_nextn_predict_layers, kMaxMtpDepths);
    LossDenominators d;
    d.sequences = batch;
    for (int64_t i = 0; i < batch * seq_len; ++i) d.lm_tokens += targets[i] != kIgnoreIndex;
    // MTP depth k predicts target t + k + 1 from position t, inside the sequence (mtp.h).
    for (int64_t depth = 0; depth < config.num_nextn_predict_layers; ++depth) {
        const int64_t shift = depth + 1;
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t t = 0; t + shift < seq_len; ++t)
                d.mtp_tokens[depth] += targets[b * seq_len + t + shift] != kIgnoreIndex;
    }
    return d;
}

// balance_scale turns the balance loss's mean over this micro-batch's sequences into its share
// of the mean over the denominators' sequences.
BlockMoeOptions Model::Impl::moe_options(int64_t slot, bool backward, float grad_scale,
                                         float balance_scale) {
    BlockMoeOptions o;
    o.load_counts = (backward && slot >= 0) ? load_counts[slot] : nullptr;
    o.balance_alpha = loss_weights.balance_alpha * balance_scale;
    o.balance_grad = loss_weights.balance_alpha * grad_scale * balance_scale;
    return o;
}

// The MTP modules need a backward when their losses carry weight: the MTP loss, or the balance
// loss of an MTP block that is MoE.
bool Model::Impl::mtp_needs_backward() const {
    if (loss_weights.mtp_lambda != 0.0f) return true;
    if (loss_weights.balance_alpha == 0.0f) return false;
    return std::any_of(mtp_slot.begin(), mtp_slot.end(), [](int64_t s) { return s >= 0; });
}

void Model::Impl::check_inputs(const int32_t* tokens, const int32_t* targets, int64_t batch,
                               int64_t seq_len) const {
    MT_CHECK(
        batch >= 1 && batch <= runtime.batch_size && seq_len >= 1 && seq_len <= runtime.seq_len,
        "[model] micro-batch B={} S={} does not fit the planned B={} S={}", batch, seq_len,
        runtime.batch_size, runtime.seq_len);
    MT_CHECK(tokens != nullptr && targets != nullptr, "[model] tokens and targets are required");
    const int64_t n = batch * seq_len;
    for (int64_t i = 0; i < n; ++i) {
        MT_CHECK(tokens[i] >= 0 && tokens[i] < config.vocab_size,
                 "[model] token {} at position {} is outside the vocabulary [0, {})", tokens[i], i,
                 config.vocab_size);
        MT_CHECK(targets[i] == kIgnoreIndex || (targets[i] >= 0 && targets[i] < config.vocab_size),
                 "[model] target {} at position {} is neither -1 nor in [0, {})", targets[i], i,
                 config.vocab_size);
    }
}

void Model::Impl::check_denominators(const LossDenominators& den, const int32_t* targets,
                                     int64_t batch, int64_t seq_len) const {
    const LossDenominators own = count_loss_denominators(config, targets, batch, seq_len);
    bool covers = den.lm_tokens >= own.lm_tokens && den.sequences >= own.sequences;
    for (size_t d = 0; d < own.mtp_tokens.size(); ++d)
        covers = covers && den.mtp_tokens[d] >= own.mtp_tokens[d];
    MT_CHECK(covers,
             "[model] the loss denominators ({} tokens, {} sequences) are smaller than this "
             "micro-batch's own counts ({} tokens, {} sequences): they must count the whole "
             "batch it is a slice of",
             den.lm_tokens, den.sequences, own.lm_tokens, own.sequences);
}

// The forward of the chunk for one micro-batch into activation set k; with `backward`, also
// the loss gradients that stage_backward starts from (on the chunk with the loss).
MicroBatchLosses Model::Impl::forward_pass(size_t ci, size_t k, const int32_t* tokens,
                                           const int32_t* targets, int64_t batch, int64_t seq_len,
                                           bool backward, float grad_scale,
                                           const LossDenominators* den) {
    check_inputs(tokens, targets, batch, seq_len);
    if (den != nullptr) check_denominators(*den, targets, batch, seq_len);
    MT_CHECK(!(backward && load_summed),
             "[model] forward_backward after sum_expert_load_over_ranks() and before "
             "update_router_bias(): its loads would not be summed");
    MT_CHECK(k < sets.size() && ci < chunks.size() && set_chunk[k] == ci,
             "[model] activation set {} of {} is not one of chunk {}'s", k, sets.size(), ci);
    ActivationSet& a = sets[k];
    const PipelineChunk& chunk = chunks[ci];
    const ModelConfig& c = config;
    const int64_t n = batch * seq_len, D = c.hidden_size;
    const int64_t first = chunk.first_layer, last = chunk.first_layer + chunk.num_layers;
    PassContext& ctx = contexts[k];
    ctx = {batch,
           seq_len,
           grad_scale,
           den == nullptr ? 1.0f
                          : static_cast<float>(static_cast<double>(batch) /
                                               static_cast<double>(den->sequences)),
           backward,
           ci};
    auto moe = [&](int64_t slot, bool counting) {
        return moe_options(slot, counting, ctx.grad_scale, ctx.balance_scale);
    };
    last_num_tokens = n;
    MicroBatchLosses losses;
    // The inputs move into the backend's memory once; every op below reads them there.
    ops.copy_from_host(a.input_tokens, tokens, static_cast<size_t>(n) * sizeof(int32_t));
    ops.copy_from_host(a.input_targets, targets, static_cast<size_t>(n) * sizeof(int32_t));

    // Forward: embedding (on the first chunk; elsewhere the previous stage's output is in
    // residual[first]) and the chunk's main blocks.
    if (chunk.embedding)
        vocab_parallel_embedding_forward(ops, a.residual[0], a.input_tokens, w.embed,
                                         a.block_scratch.full, n, c.vocab_size, D, tp);
    for (int64_t l = first; l < last; ++l) {
        losses.balance_loss += block_forward(compute, a.residual[l + 1], a.layers[l], a.residual[l],
                                             w.layers[l], a.block_scratch, rope, c, tp,
                                             moe(main_slot[l], backward), batch, seq_len);
    }
    if (!chunk.loss) return losses;

    // MTP depths, each with its loss (and that loss's head backward) right away.
    const int64_t L = c.num_hidden_layers, num_mtp = chunk.num_mtp;
    const bool run_mtp_backward = backward && mtp_needs_backward();
    const float mtp_loss_grad =
        num_mtp > 0 ? grad_scale * loss_weights.mtp_lambda / static_cast<float>(num_mtp) : 0;
    for (int64_t d = 0; d < num_mtp; ++d) {
        const float* h_prev = d == 0 ? a.residual[L] : a.mtp[d - 1].out;
        losses.balance_loss +=
            mtp_forward(compute, a.mtp[d], h_prev, a.input_tokens, a.input_targets, w.embed,
                        w.mtp[d], a.mtp_scratch, a.block_scratch, rope, c, tp,
                        moe(mtp_slot[d], backward), d, batch, seq_len);
        const int64_t mtp_den = den == nullptr ? 0 : den->mtp_tokens[d];
        const CrossEntropyResult ce =
            head_loss(compute, run_mtp_backward ? a.mtp[d].d_out : nullptr, a.mtp[d].out,
                      a.mtp[d].targets, w.mtp[d].final_norm, g.mtp[d].final_norm, w.head, g.head,
                      a.head, c, tp, n, mtp_loss_grad, mtp_den);
        losses.mtp_loss += mean_loss(ce, mtp_den);
    }
    if (num_mtp > 0) losses.mtp_loss /= static_cast<double>(num_mtp);

    // Main head last, so that logits() holds its logits after forward().
    const int64_t lm_den = den == nullptr ? 0 : den->lm_tokens;
    const CrossEntropyResult main_ce =
        head_loss(compute, backward ? a.d_stream : nullptr, a.residual[L], a.input_targets,
                  w.final_norm, g.final_norm, w.head, g.head, a.head, c, tp, n, grad_scale, lm_den);
    losses.lm_loss = mean_loss(main_ce, lm_den);
    losses.num_tokens = main_ce.num_valid;
    return losses;
}

// The backward of the micro-batch in activation set k. On the chunk with the loss the
// forward left the head's gradient in d_stream; elsewhere the next stage's is there.
void Model::Impl::backward_pass(size_t k) {
    MT_CHECK(k < sets.size() && contexts[k].backward,
             "[model] backward of activation set {} without a training forward", k);
    ActivationSet& a = sets[k];
    PassContext& ctx = contexts[k];
    ctx.backward = false;
    const PipelineChunk& chunk = chunks[ctx.chunk];
    const ModelConfig& c = config;
    const int64_t batch = ctx.batch, seq_len = ctx.seq_len;
    const int64_t n = batch * seq_len, D = c.hidden_size;
    auto moe = [&](int64_t slot) {
        return moe_options(slot, false, ctx.grad_scale, ctx.balance_scale);
    };
    if (chunk.loss) {
        notify_grads_ready(head_range);
        // MTP depths in reverse; depth d's gradient on h_{d-1} joins depth d-1's output
        // gradient, and depth 1's joins the main stream.
        const int64_t L = c.num_hidden_layers;
        const bool run_mtp_backward = mtp_needs_backward();
        for (int64_t d = chunk.num_mtp - 1; d >= 0; --d) {
            if (run_mtp_backward) {
                const float* h_prev = d == 0 ? a.residual[L] : a.mtp[d - 1].out;
                mtp_backward(compute, a.d_h_prev, g.mtp[d], g.embed, h_prev, a.mtp[d], w.mtp[d],
                             a.mtp_scratch, a.block_scratch, rope, c, tp, moe(mtp_slot[d]), batch,
                             seq_len);
                ops.add_inplace(d == 0 ? a.d_stream : a.mtp[d - 1].d_out, a.d_h_prev,
                                tp.local_rows(n) * D);
            }
            sum_replica_grads(g.mtp[d].block, mtp_slot[d]);
            notify_grads_ready(mtp_range[d]);
        }
    }
    for (int64_t l = chunk.first_layer + chunk.num_layers - 1; l >= chunk.first_layer; --l) {
        block_backward(compute, a.d_stream, g.layers[l], a.residual[l], a.layers[l], w.layers[l],
                       a.block_scratch, rope, c, tp, moe(main_slot[l]), batch, seq_len);
        sum_replica_grads(g.layers[l], main_slot[l]);
        notify_grads_ready(layer_range[l]);
    }
    if (chunk.embedding) {
        vocab_parallel_embedding_backward(ops, g.embed, a.d_stream, a.input_tokens,
                                          a.block_scratch.full, n, c.vocab_size, D, tp);
        // A shared embedding's gradient is final only once the other stage's is added.
        if (!shares_embedding()) notify_grads_ready(embed_range);
    }
    replica_sum_armed = false;
}

MicroBatchLosses Model::Impl::run(const int32_t* tokens, const int32_t* targets, int64_t batch,
                                  int64_t seq_len, bool backward, float grad_scale,
                                  const LossDenominators* den) {
    MT_CHECK(chunks.size() == 1 && chunks[0].embedding && chunks[0].loss,
             "[model] forward_backward and forward run the whole model; a pipeline stage "
             "runs stage_forward and stage_backward");
    const MicroBatchLosses losses =
        forward_pass(0, 0, tokens, targets, batch, seq_len, backward, grad_scale, den);
    if (backward) backward_pass(0);
    return losses;
}

double Model::Impl::mean_loss(const CrossEntropyResult& ce, int64_t denominator) {
    if (denominator <= 0) return ce.mean();
    return ce.loss_sum / static_cast<double>(denominator);
}

MicroBatchLosses Model::forward_backward(const int32_t* tokens, const int32_t* targets,
                                         int64_t batch, int64_t seq_len, float grad_scale) {
    return impl_->run(tokens, targets, batch, seq_len, true, grad_scale, nullptr);
}

MicroBatchLosses Model::forward_backward(const int32_t* tokens, const int32_t* targets,
                                         int64_t batch, int64_t seq_len, float grad_scale,
                                         const LossDenominators& denominators) {
    return impl_->run(tokens, targets, batch, seq_len, true, grad_scale, &denominators);
}

MicroBatchLosses Model::forward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                                int64_t seq_len) {
    return impl_->run(tokens, targets, batch, seq_len, false, 0.0f, nullptr);
}

const float* Model::logits() const {
    return impl_->sets[0].head.logits;
}

}  // namespace moetron
