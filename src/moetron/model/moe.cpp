#include "moetron/model/moe.h"

#include <span>

#include "moetron/core/timer.h"
#include "moetron/kernels/backend.h"
#include "moetron/parallel/expert_dispatcher.h"

namespace moetron {

namespace {

RouterShape router_shape(const ModelConfig& c, int64_t num_tokens) {
    return {num_tokens,      c.n_routed_experts, c.num_experts_per_tok,
            c.n_group,       c.topk_group,       static_cast<float>(c.routed_scaling_factor),
            c.norm_topk_prob};
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

// The token rows [first, first + count) that one routing (dispatcher slot) sends to the experts,
// and where its rows start on the expert side: the whole share of the rank, or one half of it.
struct TokenHalf {
    int64_t first = 0, count = 0;
    int64_t slot = 0;
    int64_t expert_row = 0;  // first expert-side row of this half (after the previous half's)
    int64_t num_rows = 0;    // R of this half
    const int64_t* offsets = nullptr;
};

// The halves of `own`: one, or two with the dual overlap (A gets the odd token).
int split_halves(TokenHalf* halves, const MoeActivations& saved, parallel::RowRange own) {
    if (saved.overlap != MoeOverlap::dual) {
        halves[0] = {own.first, own.count, saved.dispatch_slot};
        return 1;
    }
    MT_CHECK(saved.dispatch_slot_b >= 0, "[moe] the dual overlap needs a second dispatch slot");
    const int64_t a = (own.count + 1) / 2;
    halves[0] = {own.first, a, saved.dispatch_slot};
    halves[1] = {own.first + a, own.count - a, saved.dispatch_slot_b};
    return 2;
}

// Round i of a routing split into rounds (ExpertDispatcher::plan_rounds): the rank's tokens
// [ends[i-1], ends[i]), through the layer's first slot and the whole expert-side buffers.
TokenHalf round_of(std::span<const int64_t> ends, size_t i, const MoeActivations& saved,
                   parallel::RowRange own) {
    const int64_t first = i == 0 ? 0 : ends[i - 1];
    return {own.first + first, ends[i] - first, saved.dispatch_slot};
}

// After routing: each half's expert-side rows, packed one after the other.
void place_halves(TokenHalf* halves, int num_halves, const parallel::ExpertDispatcher& dispatch,
                  int64_t expert_rows) {
    int64_t row = 0;
    for (int i = 0; i < num_halves; ++i) {
        halves[i].expert_row = row;
        halves[i].num_rows = dispatch.num_expert_rows(halves[i].slot);
        halves[i].offsets = dispatch.expert_offsets(halves[i].slot).data();
        row += halves[i].num_rows;
    }
    MT_CHECK(row <= expert_rows,
             "[moe] the two halves' routings bring {} expert rows, but the layer holds {}; raise "
             "the dispatch capacity or use --moe-overlap shared",
             row, expert_rows);
}

// The experts' first GEMM (gate and up projections). Token rows that travelled in the GEMM's own
// format (saved.token_format, the recipe's by default) already hold its row-wise quantized
// values: the GEMM uses them as they arrived.
void experts_gate_up_forward(const ModelCompute& compute, float* gate_up, const float* expert_inp,
                             const MoeActivations& saved, const MoeParams& w, const TokenHalf& h,
                             int64_t El, int64_t D, int64_t F) {
    GemmPrecision gemm = compute.gemm(GemmRole::expert);
    gemm.input_quantized =
        saved.token_format != Precision::fp32 && saved.token_format == gemm.format;
    compute.ops.grouped_linear_forward(gate_up, expert_inp, w.experts_gate_up, h.offsets, El, D,
                                       2 * F, gemm);
}

// The routed experts of one half: one grouped SwiGLU over its rows.
void experts_forward(const ModelCompute& compute, const MoeActivations& saved, const MoeParams& w,
                     const TokenHalf& h, int64_t El, int64_t D, int64_t F) {
    const Timer timer;
    Backend& ops = compute.ops;
    const int64_t r = h.expert_row;
    experts_gate_up_forward(compute, saved.expert_gate_up + r * 2 * F, saved.permuted + r * D,
                            saved, w, h, El, D, F);
    ops.swiglu_forward(saved.expert_hidden + r * F, saved.expert_gate_up + r * 2 * F, h.num_rows,
                       F);
    ops.grouped_linear_forward(saved.expert_out + r * D, saved.expert_hidden + r * F,
                               w.experts_down, h.offsets, El, F, D, compute.gemm(GemmRole::expert));
    if (saved.expert_compute_s != nullptr) *saved.expert_compute_s += timer.elapsed_s();
}

// Its backward: scratch.d_expert_out (the half's rows) in, the inputs' gradient written over it
// (d_expert_out is free again once d_expert_hidden exists).
void experts_backward(const ModelCompute& compute, const MoeParams& grads,
                      const MoeActivations& saved, const MoeParams& w, const MoeScratch& scratch,
                      const TokenHalf& h, int64_t El, int64_t D, int64_t F) {
    const Timer timer;
    Backend& ops = compute.ops;
    const GemmPrecision expert = compute.gemm(GemmRole::expert);
    const int64_t r = h.expert_row;
    float* d_out = scratch.d_expert_out + r * D;
    float* d_hidden = scratch.d_expert_hidden + r * F;
    float* d_gate_up = scratch.d_expert_gate_up + r * 2 * F;
    ops.grouped_linear_backward(d_hidden, grads.experts_down, d_out, saved.expert_hidden + r * F,
                                w.experts_down, h.offsets, El, F, D, expert);
    ops.swiglu_backward(d_gate_up, d_hidden, saved.expert_gate_up + r * 2 * F, h.num_rows, F);
    ops.grouped_linear_backward(d_out, grads.experts_gate_up, d_gate_up, saved.permuted + r * D,
                                w.experts_gate_up, h.offsets, El, D, 2 * F, expert);
    if (saved.expert_compute_s != nullptr) *saved.expert_compute_s += timer.elapsed_s();
    if (saved.expert_rows_computed != nullptr) *saved.expert_rows_computed += h.num_rows;
}

// Zeroes the rows of x (N, D) outside `own`: other TP ranks fill them, and the caller sums over TP.
void zero_other_rows(Backend& ops, float* x, parallel::RowRange own, int64_t num_rows,
                     int64_t dim) {
    ops.zero(x, static_cast<size_t>(own.first * dim) * sizeof(float));
    const int64_t end = own.first + own.count;
    ops.zero(x + end * dim, static_cast<size_t>((num_rows - end) * dim) * sizeof(float));
}

}  // namespace

MoeOverlap parse_moe_overlap(std::string_view name) {
    if (name == "off") return MoeOverlap::off;
    if (name == "shared") return MoeOverlap::shared;
    if (name == "dual") return MoeOverlap::dual;
    MT_THROW("[moe] unknown MoE overlap '{}'; use off, shared or dual", name);
}

std::string_view moe_overlap_name(MoeOverlap overlap) {
    switch (overlap) {
        case MoeOverlap::shared:
            return "shared";
        case MoeOverlap::dual:
            return "dual";
        case MoeOverlap::off:
            break;
    }
    return "off";
}

int64_t shared_expert_ffn_dim(const ModelConfig& c, int tp_size) {
    return c.n_shared_experts * c.moe_intermediate_size / tp_size;
}

bool is_routed_expert_param(std::string_view name) {
    return name.ends_with("experts.gate_up") || name.ends_with("experts.down");
}

bool is_expert_side_buffer(std::string_view name) {
    for (std::string_view suffix : {"permuted", "expert_gate_up", "expert_hidden", "expert_out"})
        if (name.ends_with(suffix)) return true;  // also d_expert_*, the scratch gradients
    return false;
}

void bind_moe_params(ParamBinder& b, MoeParams& p, const std::string& prefix,
                     const ModelConfig& c) {
    const int64_t E = c.n_routed_experts, D = c.hidden_size, F = c.moe_intermediate_size;
    const int64_t El = p.experts.local_experts(E);
    MT_CHECK(
        p.experts.first >= 0 && p.experts.count >= 0 && p.experts.first + El <= p.experts.slots(E),
        "[moe] experts [{}, {}) of layer '{}' are not within the {} routed expert slots",
        p.experts.first, p.experts.first + El, prefix, p.experts.slots(E));
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

double moe_forward(const ModelCompute& compute, float* out, const MoeActivations& saved,
                   int64_t* load_counts, const float* inp, const MoeParams& w,
                   const MoeScratch& scratch, const ModelConfig& c,
                   const parallel::TensorParallel& tp, float balance_alpha, int64_t batch,
                   int64_t seq_len) {
    Backend& ops = compute.ops;
    const int64_t n = batch * seq_len, E = c.n_routed_experts, K = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    // The tokens this rank sends to the experts: all of them without tensor parallelism.
    const parallel::RowRange own = tp.row_share(n, "tokens of the MoE layer's micro-batch");

    // Router (eq. 15-16): the gate GEMM, then sigmoid, biased group-limited top-K and weights.
    // Every low-precision recipe keeps the router in float32 (compute.h).
    ops.linear_forward(scratch.logits, inp, w.gate, n, D, E, compute.gemm(GemmRole::router));
    ops.router_forward(saved.topk_ids, saved.topk_weights, saved.scores, scratch.logits,
                       w.correction_bias, router_shape(c, n));
    if (load_counts != nullptr)
        ops.count_expert_load(load_counts, saved.topk_ids + own.first * K, own.count * K, E);

    // Routed experts: the copies go to their experts' ranks sorted by local expert, one grouped
    // SwiGLU there, and come back summed with their weights. With overlap, each all-to-all is
    // begun, computation that does not need it runs, then it is finished (MoeOverlap).
    const int64_t El = w.experts.local_experts(E);
    const int64_t expert_rows = expert_side_rows(saved.expert_rows, n, K);
    parallel::ExpertDispatcher& dispatch = dispatcher_of(saved, expert_rows, El);
    // Shared experts see every token (eq. 12); computed first they write out, else they add.
    const bool has_shared = c.n_shared_experts > 0;
    const bool shared_first = has_shared && saved.overlap != MoeOverlap::off;
    auto shared_experts = [&](bool accumulate) {
        mlp_forward(compute, out, saved.shared, inp, w.shared, n, D,
                    shared_expert_ffn_dim(c, tp.size()), accumulate);
    };
    auto begin_dispatch = [&](const TokenHalf& h) {
        dispatch.dispatch_forward_begin(h.slot, saved.permuted + h.expert_row * D,
                                        inp + h.first * D, saved.token_format);
    };
    auto begin_combine = [&](const TokenHalf& h) {
        dispatch.combine_forward_begin(h.slot, out + h.first * D,
                                       saved.expert_out + h.expert_row * D,
                                       saved.topk_weights + h.first * K, shared_first);
    };
    auto route = [&](const TokenHalf& h) {
        dispatch.route(h.slot, saved.topk_ids + h.first * K, saved.topk_weights + h.first * K,
                       h.count, h.first - own.first);
    };
    if (tp.enabled() && !shared_first) zero_other_rows(ops, out, own, n, D);

    const std::span<const int64_t> rounds =
        dispatch.plan_rounds(saved.dispatch_slot, saved.topk_ids + own.first * K, own.count);
    if (rounds.size() > 1) {
        // More rows than the buffers hold: round by round through them, blocking (a rare step,
        // no overlap). The buffers keep the last round's activations (moe_backward recomputes
        // the others').
        if (shared_first) shared_experts(/*accumulate=*/false);
        for (size_t i = 0; i < rounds.size(); ++i) {
            TokenHalf h = round_of(rounds, i, saved, own);
            route(h);
            place_halves(&h, 1, dispatch, expert_rows);
            begin_dispatch(h);
            dispatch.finish(h.slot);
            experts_forward(compute, saved, w, h, El, D, F);
            begin_combine(h);
            dispatch.finish(h.slot);
        }
    } else {
        TokenHalf halves[2];
        const int num_halves = split_halves(halves, saved, own);
        for (int i = 0; i < num_halves; ++i) route(halves[i]);
        place_halves(halves, num_halves, dispatch, expert_rows);
        begin_dispatch(halves[0]);
        if (shared_first) shared_experts(/*accumulate=*/false);
        dispatch.finish(halves[0].slot);
        if (num_halves == 2) begin_dispatch(halves[1]);
        experts_forward(compute, saved, w, halves[0], El, D, F);
        begin_combine(halves[0]);
        if (num_halves == 2) {
            dispatch.finish(halves[1].slot);
            dispatch.post_next_hop(halves[0].slot);  // two_tier: A's combine crosses the rail now
            experts_forward(compute, saved, w, halves[1], El, D, F);
            begin_combine(halves[1]);
        }
        for (int i = 0; i < num_halves; ++i) dispatch.finish(halves[i].slot);
    }
    if (has_shared && !shared_first) shared_experts(/*accumulate=*/true);

    if (balance_alpha == 0.0f) return 0.0;
    // Sequence-wise balance loss (eq. 17-20).
    const double loss_sum = ops.balance_loss_forward(saved.load_fraction, saved.topk_ids,
                                                     saved.scores, batch, seq_len, E, K);
    return static_cast<double>(balance_alpha) * loss_sum / static_cast<double>(batch);
}

void moe_backward(const ModelCompute& compute, float* dinp, const MoeParams& grads,
                  const float* dout, const float* inp, const MoeActivations& saved,
                  const MoeParams& w, const MoeScratch& scratch, const MlpScratch& shared_scratch,
                  const ModelConfig& c, const parallel::TensorParallel& tp, float balance_grad,
                  int64_t batch, int64_t seq_len) {
    Backend& ops = compute.ops;
    const int64_t n = batch * seq_len, E = c.n_routed_experts, K = c.num_experts_per_tok;
    const int64_t D = c.hidden_size, F = c.moe_intermediate_size;
    const parallel::RowRange own = tp.row_share(n, "tokens of the MoE layer's micro-batch");

    // Routed experts, in reverse: combine's backward sends the output gradients to the experts'
    // ranks, dispatch's brings the input gradients back; overlapped as in the forward.
    const int64_t El = w.experts.local_experts(E);
    const int64_t expert_rows = expert_side_rows(saved.expert_rows, n, K);
    parallel::ExpertDispatcher& dispatch = dispatcher_of(saved, expert_rows, El);
    float* d_topk_own = tp.enabled() ? scratch.d_topk_weights_own : scratch.d_topk_weights;
    const bool has_shared = c.n_shared_experts > 0;
    const bool shared_first = has_shared && saved.overlap != MoeOverlap::off;
    auto shared_experts = [&](bool accumulate) {
        mlp_backward(compute, dinp, grads.shared, dout, inp, saved.shared, w.shared, shared_scratch,
                     n, D, shared_expert_ffn_dim(c, tp.size()), accumulate);
    };
    auto begin_combine_backward = [&](const TokenHalf& h) {
        const int64_t t = h.first - own.first;  // the half's first row in the rank's share
        dispatch.combine_backward_begin(
            h.slot, scratch.d_expert_out + h.expert_row * D, d_topk_own + t * K, dout + h.first * D,
            saved.topk_weights + h.first * K, saved.expert_out + h.expert_row * D);
    };
    auto begin_dispatch_backward = [&](const TokenHalf& h) {
        dispatch.dispatch_backward_begin(h.slot, dinp + h.first * D,
                                         scratch.d_expert_out + h.expert_row * D, shared_first);
    };

    const std::span<const int64_t> rounds = dispatch.round_ends(saved.dispatch_slot);
    if (rounds.size() > 1) {
        // The forward's rounds, last first: the buffers and the slot hold the last round's
        // routing and activations; each earlier round routes and computes its experts again.
        if (shared_first) shared_experts(/*accumulate=*/false);
        for (size_t i = rounds.size(); i-- > 0;) {
            TokenHalf h = round_of(rounds, i, saved, own);
            if (i + 1 < rounds.size()) {
                dispatch.route(h.slot, saved.topk_ids + h.first * K,
                               saved.topk_weights + h.first * K, h.count, h.first - own.first);
                place_halves(&h, 1, dispatch, expert_rows);
                dispatch.dispatch_forward(h.slot, saved.permuted, inp + h.first * D,
                                          saved.token_format);
                experts_forward(compute, saved, w, h, El, D, F);
            } else {
                place_halves(&h, 1, dispatch, expert_rows);
            }
            begin_combine_backward(h);
            dispatch.finish(h.slot);
            experts_backward(compute, grads, saved, w, scratch, h, El, D, F);
            begin_dispatch_backward(h);
            dispatch.finish(h.slot);
        }
    } else {
        TokenHalf halves[2];
        const int num_halves = split_halves(halves, saved, own);
        place_halves(halves, num_halves, dispatch, expert_rows);
        begin_combine_backward(halves[0]);
        if (shared_first) shared_experts(/*accumulate=*/false);
        dispatch.finish(halves[0].slot);
        if (num_halves == 2) begin_combine_backward(halves[1]);
        experts_backward(compute, grads, saved, w, scratch, halves[0], El, D, F);
        begin_dispatch_backward(halves[0]);
        if (num_halves == 2) {
            dispatch.finish(halves[1].slot);
            dispatch.post_next_hop(halves[0].slot);  // two_tier: A's gradients cross the rail now
            experts_backward(compute, grads, saved, w, scratch, halves[1], El, D, F);
            begin_dispatch_backward(halves[1]);
        }
        for (int i = 0; i < num_halves; ++i) dispatch.finish(halves[i].slot);
    }
    if (!shared_first) {
        if (tp.enabled()) zero_other_rows(ops, dinp, own, n, D);
        if (has_shared) shared_experts(/*accumulate=*/true);
    }
    // Every rank runs the router's backward on all N tokens, so it needs every rank's share.
    tp.all_gather(scratch.d_topk_weights, d_topk_own, own.count * K);

    // Balance loss on the scores: d/ds_{j,t} of (1/T) sum_i f_i s_{i,t} / Z_t is
    // (1/T) (f_j / Z_t - sum_i f_i s_{i,t} / Z_t^2); averaged over the B sequences.
    const float* d_scores = nullptr;
    if (balance_grad != 0.0f) {
        ops.balance_loss_backward(scratch.d_scores, saved.scores, saved.load_fraction, batch,
                                  seq_len, E, balance_grad);
        d_scores = scratch.d_scores;
    }

    // Router: through the chosen scores (and the balance term), then the gate GEMM.
    float* d_logits = scratch.logits;
    ops.router_backward(d_logits, scratch.d_topk_weights, d_scores, saved.scores, saved.topk_ids,
                        router_shape(c, n));
    // Its backward stays whole under a split backward (compute.h).
    const GemmPrecision router = compute.gemm(GemmRole::router);
    compute.whole_backward.linear_backward(nullptr, grads.gate, d_logits, inp, w.gate, n, D, E,
                                           router);
    // The router's input gradient is the same on every TP rank: each adds it to its own rows
    // only, so that the sum over TP counts it once.
    compute.whole_backward.matmul(dinp + own.first * D, d_logits + own.first * E, w.gate, own.count,
                                  D, E, false, false, 1.0f, router);
}

}  // namespace moetron
