#include "moetron/model/moe.h"

#include <algorithm>

#include "moetron/kernels/cpu/matmul.h"
#include "moetron/kernels/cpu/router.h"
#include "moetron/kernels/cpu/swiglu.h"
#include "moetron/parallel/expert_dispatcher.h"

namespace moetron {

namespace {

cpu::RouterShape router_shape(const ModelConfig& c, int64_t num_tokens) {
    return {num_tokens,      c.n_routed_experts, c.num_experts_per_tok,
            c.n_group,       c.topk_group,       static_cast<float>(c.routed_scaling_factor),
            c.norm_topk_prob};
}

// Per token: Z_t = sum_j s_{j,t} and sum_i f_i s_{i,t}, the two sums eq. 19-20 need.
struct TokenBalanceSums {
    double score_sum = 0;
    double weighted_score_sum = 0;
};

TokenBalanceSums token_balance_sums(const float* scores, const float* load_fraction,
                                    int64_t num_experts) {
    TokenBalanceSums s;
    for (int64_t i = 0; i < num_experts; ++i) {
        s.score_sum += scores[i];
        s.weighted_score_sum += static_cast<double>(load_fraction[i]) * scores[i];
    }
    return s;
}

int64_t expert_side_rows(int64_t planned_rows, int64_t num_tokens, int64_t top_k) {
    return planned_rows > 0 ? planned_rows : num_tokens * top_k;
}

parallel::ExpertDispatcher& dispatcher_of(const MoeActivations& saved, int64_t expert_rows,
                                          int64_t local_experts) {
    MT_CHECK(saved.dispatcher != nullptr, "[moe] the layer has no expert dispatcher");
    parallel::ExpertDispatcher& d = *saved.dispatcher;
    MT_CHECK(d.num_local_experts() == local_experts && d.capacity_rows() <= expert_rows,
             "[moe] the dispatcher ({} local experts, {} rows) does not fit the layer ({} local "
             "experts, {} rows)",
             d.num_local_experts(), d.capacity_rows(), local_experts, expert_rows);
    return d;
}

// Zeroes the rows of x (N, D) outside `own`: other TP ranks fill them, and the caller sums over TP.
void zero_other_rows(float* x, parallel::RowRange own, int64_t num_rows, int64_t dim) {
    std::fill(x, x + own.first * dim, 0.0f);
    std::fill(x + (own.first + own.count) * dim, x + num_rows * dim, 0.0f);
}

}  // namespace

int64_t shared_expert_ffn_dim(const ModelConfig& c, int tp_size) {
    return c.n_shared_experts * c.moe_intermediate_size / tp_size;
}

bool is_routed_expert_param(std::string_view name) {
    return name.ends_with("experts.gate_up") || name.ends_with("experts.down");
}

void bind_moe_params(ParamBinder& b, MoeParams& p, const std::string& prefix,
                     const ModelConfig& c) {
    const int64_t E = c.n_routed_experts, D = c.hidden_size, F = c.moe_intermediate_size;
    const int64_t El = p.experts.local_experts(E);
    MT_CHECK(p.experts.first >= 0 && p.experts.count >= 0 && p.experts.first + El <= E,
             "[moe] experts [{}, {}) of layer '{}' are not within the {} routed experts",
             p.experts.first, p.experts.first + El, prefix, E);
    b.weight(p.gate, prefix + "router", {E, D});
    b.correction_bias(p.correction_bias, prefix + "router_bias", E);
    b.weight(p.experts_gate_up, prefix + "experts.gate_up", {El, 2 * F, D});
    b.weight(p.experts_down, prefix + "experts.down", {El, D, F});
    if (c.n_shared_experts > 0)
        bind_mlp_params(b, p.shared, prefix + "shared.", D, shared_expert_ffn_dim(c, 1));
}

void bind_moe_activations(BufferBinder& b, MoeActivations& a, const std::string& prefix,
                          const ModelConfig& c, int tp_size, int64_t batch, int64_t seq_len) {
    const int64_t n = batch * seq_len, E = c.n_routed_experts, K = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    const int64_t R = expert_side_rows(a.expert_rows, n, K);
    b(a.scores, prefix + "scores", {n, E});
    b(a.topk_ids, prefix + "topk_ids", {n, K});
    b(a.topk_weights, prefix + "topk_weights", {n, K});
    b(a.permuted, prefix + "permuted", {R, D});
    b(a.expert_gate_up, prefix + "expert_gate_up", {R, 2 * F});
    b(a.expert_hidden, prefix + "expert_hidden", {R, F});
    b(a.expert_out, prefix + "expert_out", {R, D});
    b(a.load_fraction, prefix + "load_fraction", {batch, E});
    if (c.n_shared_experts > 0)
        bind_mlp_activations(b, a.shared, prefix + "shared.", n, shared_expert_ffn_dim(c, tp_size));
}

void bind_moe_scratch(BufferBinder& b, MoeScratch& s, const std::string& prefix,
                      const ModelConfig& c, int tp_size, int64_t num_tokens) {
    const int64_t n = num_tokens, E = c.n_routed_experts, K = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    const int64_t R = expert_side_rows(s.expert_rows, n, K);
    b(s.logits, prefix + "logits", {n, E});
    b(s.d_topk_weights, prefix + "d_topk_weights", {n, K});
    b(s.d_scores, prefix + "d_scores", {n, E});
    b(s.d_expert_out, prefix + "d_expert_out", {R, D});
    b(s.d_expert_hidden, prefix + "d_expert_hidden", {R, F});
    b(s.d_expert_gate_up, prefix + "d_expert_gate_up", {R, 2 * F});
    if (tp_size > 1) b(s.d_topk_weights_own, prefix + "d_topk_weights_own", {n / tp_size, K});
}

double moe_forward(float* out, const MoeActivations& saved, int64_t* load_counts, const float* inp,
                   const MoeParams& w, const MoeScratch& scratch, const ModelConfig& c,
                   const parallel::TensorParallel& tp, float balance_alpha, int64_t batch,
                   int64_t seq_len) {
    const int64_t n = batch * seq_len, E = c.n_routed_experts, K = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    // The tokens this rank sends to the experts: all of them without tensor parallelism.
    const parallel::RowRange own = tp.row_share(n, "tokens of the MoE layer's micro-batch");

    // Router (eq. 15-16): the gate GEMM, then sigmoid, biased group-limited top-K and weights.
    cpu::linear_forward(scratch.logits, inp, w.gate, n, D, E);
    cpu::router_forward(saved.topk_ids, saved.topk_weights, saved.scores, scratch.logits,
                        w.correction_bias, router_shape(c, n));
    if (load_counts != nullptr) {
        for (int64_t i = own.first * K; i < (own.first + own.count) * K; ++i)
            ++load_counts[saved.topk_ids[i]];
    }

    // Routed experts: the copies go to their experts' ranks sorted by local expert, one grouped
    // SwiGLU there, and come back summed with their weights.
    const int64_t El = w.experts.local_experts(E);
    parallel::ExpertDispatcher& dispatch =
        dispatcher_of(saved, expert_side_rows(saved.expert_rows, n, K), El);
    const int64_t slot = saved.dispatch_slot;
    dispatch.route(slot, saved.topk_ids + own.first * K, saved.topk_weights + own.first * K,
                   own.count);
    const int64_t R = dispatch.num_expert_rows(slot);
    const int64_t* offsets = dispatch.expert_offsets(slot).data();
    dispatch.dispatch_forward(slot, saved.permuted, inp + own.first * D);
    cpu::grouped_linear_forward(saved.expert_gate_up, saved.permuted, w.experts_gate_up, offsets,
                                El, D, 2 * F);
    cpu::swiglu_forward(saved.expert_hidden, saved.expert_gate_up, R, F);
    cpu::grouped_linear_forward(saved.expert_out, saved.expert_hidden, w.experts_down, offsets, El,
                                F, D);
    if (tp.enabled()) zero_other_rows(out, own, n, D);
    dispatch.combine_forward(slot, out + own.first * D, saved.expert_out,
                             saved.topk_weights + own.first * K);

    // Shared experts see every token (eq. 12).
    if (c.n_shared_experts > 0)
        mlp_forward(out, saved.shared, inp, w.shared, n, D, shared_expert_ffn_dim(c, tp.size()),
                    true);

    if (balance_alpha == 0.0f) return 0.0;
    // Sequence-wise balance loss (eq. 17-20).
    const double count_to_fraction =
        static_cast<double>(E) / (static_cast<double>(K) * static_cast<double>(seq_len));
    double loss_sum = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : loss_sum)
    for (int64_t b = 0; b < batch; ++b) {
        float* f = saved.load_fraction + b * E;
        for (int64_t i = 0; i < E; ++i) f[i] = 0.0f;
        const int64_t first = b * seq_len;
        for (int64_t t = first; t < first + seq_len; ++t)
            for (int64_t j = 0; j < K; ++j) f[saved.topk_ids[t * K + j]] += 1.0f;
        for (int64_t i = 0; i < E; ++i) f[i] = static_cast<float>(f[i] * count_to_fraction);
        // sum_i f_i P_i = (1/T) sum_t (sum_i f_i s_{i,t}) / Z_t
        double sequence_sum = 0.0;
        for (int64_t t = first; t < first + seq_len; ++t) {
            const TokenBalanceSums s = token_balance_sums(saved.scores + t * E, f, E);
            sequence_sum += s.weighted_score_sum / s.score_sum;
        }
        loss_sum += sequence_sum / static_cast<double>(seq_len);
    }
    return static_cast<double>(balance_alpha) * loss_sum / static_cast<double>(batch);
}

void moe_backward(float* dinp, const MoeParams& grads, const float* dout, const float* inp,
                  const MoeActivations& saved, const MoeParams& w, const MoeScratch& scratch,
                  const MlpScratch& shared_scratch, const ModelConfig& c,
                  const parallel::TensorParallel& tp, float balance_grad, int64_t batch,
                  int64_t seq_len) {
    const int64_t n = batch * seq_len, E = c.n_routed_experts, K = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    const parallel::RowRange own = tp.row_share(n, "tokens of the MoE layer's micro-batch");

    // Routed experts, in reverse: combine's backward sends the output gradients to the experts'
    // ranks, dispatch's brings the input gradients back. d_expert_out is free again once
    // d_expert_hidden exists, so it takes the gradient of the permuted inputs.
    const int64_t El = w.experts.local_experts(E);
    parallel::ExpertDispatcher& dispatch =
        dispatcher_of(saved, expert_side_rows(saved.expert_rows, n, K), El);
    const int64_t slot = saved.dispatch_slot;
    const int64_t R = dispatch.num_expert_rows(slot);
    const int64_t* offsets = dispatch.expert_offsets(slot).data();
    float* d_topk_own = tp.enabled() ? scratch.d_topk_weights_own : scratch.d_topk_weights;
    dispatch.combine_backward(slot, scratch.d_expert_out, d_topk_own, dout + own.first * D,
                              saved.topk_weights + own.first * K, saved.expert_out);
    cpu::grouped_linear_backward(scratch.d_expert_hidden, grads.experts_down, scratch.d_expert_out,
                                 saved.expert_hidden, w.experts_down, offsets, El, F, D);
    cpu::swiglu_backward(scratch.d_expert_gate_up, scratch.d_expert_hidden, saved.expert_gate_up, R,
                         F);
    float* d_permuted = scratch.d_expert_out;
    cpu::grouped_linear_backward(d_permuted, grads.experts_gate_up, scratch.d_expert_gate_up,
                                 saved.permuted, w.experts_gate_up, offsets, El, D, 2 * F);
    dispatch.dispatch_backward(slot, dinp + own.first * D, d_permuted);
    if (tp.enabled()) zero_other_rows(dinp, own, n, D);

    if (c.n_shared_experts > 0)
        mlp_backward(dinp, grads.shared, dout, inp, saved.shared, w.shared, shared_scratch, n, D,
                     shared_expert_ffn_dim(c, tp.size()), true);
    // Every rank runs the router's backward on all N tokens, so it needs every rank's share.
    tp.all_gather(scratch.d_topk_weights, d_topk_own, own.count * K);

    // Balance loss on the scores: d/ds_{j,t} of (1/T) sum_i f_i s_{i,t} / Z_t is
    // (1/T) (f_j / Z_t - sum_i f_i s_{i,t} / Z_t^2); averaged over the B sequences.
    const float* d_scores = nullptr;
    if (balance_grad != 0.0f) {
        const double coeff = static_cast<double>(balance_grad) /
                             (static_cast<double>(batch) * static_cast<double>(seq_len));
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < n; ++t) {
            const float* f = saved.load_fraction + (t / seq_len) * E;
            const float* s = saved.scores + t * E;
            const TokenBalanceSums sums = token_balance_sums(s, f, E);
            const double inv_z = 1.0 / sums.score_sum;
            const double common = sums.weighted_score_sum * inv_z * inv_z;
            float* ds = scratch.d_scores + t * E;
            for (int64_t j = 0; j < E; ++j)
                ds[j] = static_cast<float>(coeff * (f[j] * inv_z - common));
        }
        d_scores = scratch.d_scores;
    }

    // Router: through the chosen scores (and the balance term), then the gate GEMM.
    float* d_logits = scratch.logits;
    cpu::router_backward(d_logits, scratch.d_topk_weights, d_scores, saved.scores, saved.topk_ids,
                         router_shape(c, n));
    cpu::linear_backward(nullptr, grads.gate, d_logits, inp, w.gate, n, D, E);
    // The router's input gradient is the same on every TP rank: each adds it to its own rows
    // only, so that the sum over TP counts it once.
    cpu::matmul(dinp + own.first * D, d_logits + own.first * E, w.gate, own.count, D, E, false,
                false, 1.0f);
}

}  // namespace moetron
