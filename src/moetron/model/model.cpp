// The whole model: embedding -> blocks -> final norm -> head -> cross-entropy, the MTP modules on
// the last hidden state, and the backward through all of it (DESIGN.md sec. 2).
//
// Order of one forward_backward:
//   forward: embedding, main blocks; per MTP depth its module, then its head and loss with the
//     head's backward right away (the (N, V) logits buffer is then free for the next head, so one
//     suffices); then the main head, loss and head backward.
//   backward: MTP depths in reverse (each adds its gradient on h_{d-1} to the previous depth's, or
//     the main stream's), main blocks in reverse, embedding.
#include "moetron/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/kernels/cpu/cross_entropy.h"
#include "moetron/kernels/cpu/elementwise.h"
#include "moetron/kernels/cpu/embedding.h"
#include "moetron/kernels/cpu/matmul.h"
#include "moetron/kernels/cpu/rmsnorm.h"
#include "moetron/kernels/cpu/rope.h"
#include "moetron/model/block.h"
#include "moetron/model/mtp.h"

namespace moetron {

namespace {

constexpr int32_t kIgnoreIndex = -1;

struct ModelParams {
    float* embed = nullptr;  // (V, D) HF model.embed_tokens
    std::vector<BlockParams> layers;
    float* final_norm = nullptr;  // (D) HF model.norm
    float* head = nullptr;        // (V, D) HF lm_head, untied
    std::vector<MtpParams> mtp;
};

void bind_model_params(ParamBinder& b, ModelParams& p, const ModelConfig& c) {
    const int64_t V = c.vocab_size, D = c.hidden_size;
    b.weight(p.embed, "embed", {V, D});
    p.layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        bind_block_params(b, p.layers[l], main_layer_prefix(l), c, c.is_moe_layer(l));
    b.norm(p.final_norm, "final_norm", D);
    b.weight(p.head, "head", {V, D});
    p.mtp.resize(static_cast<size_t>(c.num_nextn_predict_layers));
    for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d)
        bind_mtp_params(b, p.mtp[d], mtp_prefix(d), c, d);
}

// The final norm, output head and cross-entropy; shared by the main model and the MTP depths.
struct HeadScratch {
    float* normed = nullptr;    // (N, D)
    float* rstd = nullptr;      // (N)
    float* logits = nullptr;    // (N, V); their gradient after a backward
    float* lse = nullptr;       // (N)
    float* losses = nullptr;    // (N)
    float* d_normed = nullptr;  // (N, D)
};

void bind_head_scratch(BufferBinder& b, HeadScratch& s, const ModelConfig& c, int64_t n) {
    b(s.normed, "head.normed", {n, c.hidden_size});
    b(s.rstd, "head.rstd", {n});
    b(s.logits, "head.logits", {n, c.vocab_size});
    b(s.lse, "head.lse", {n});
    b(s.losses, "head.losses", {n});
    b(s.d_normed, "head.d_normed", {n, c.hidden_size});
}

// Mean cross-entropy of head(rmsnorm(hidden)) against targets. When d_hidden is not null, also
// its backward for a loss weight of loss_grad on the mean: d_hidden (N, D) written; the norm's
// and head's gradients accumulate.
cpu::CrossEntropyResult head_loss(float* d_hidden, const float* hidden, const int32_t* targets,
                                  const float* norm_w, float* norm_g, const float* head_w,
                                  float* head_g, const HeadScratch& s, const ModelConfig& c,
                                  int64_t n, float loss_grad) {
    const int64_t D = c.hidden_size, V = c.vocab_size;
    cpu::rmsnorm_forward(s.normed, s.rstd, hidden, norm_w, n, D,
                         static_cast<float>(c.rms_norm_eps));
    cpu::linear_forward(s.logits, s.normed, head_w, n, D, V);
    const cpu::CrossEntropyResult ce =
        cpu::cross_entropy_forward(s.losses, s.lse, s.logits, targets, n, V, kIgnoreIndex);
    if (d_hidden == nullptr) return ce;

    const float per_token = ce.num_valid > 0 ? loss_grad / static_cast<float>(ce.num_valid) : 0.0f;
    cpu::cross_entropy_backward(s.logits, s.logits, s.lse, targets, n, V, kIgnoreIndex, per_token);
    cpu::linear_backward(s.d_normed, head_g, s.logits, s.normed, head_w, n, D, V);
    cpu::rmsnorm_backward(d_hidden, norm_g, s.d_normed, hidden, norm_w, s.rstd, n, D);
    return ce;
}

void check_model_config(const ModelConfig& c, const ModelRuntime& r) {
    validate_model_config(c);
    MT_CHECK(!c.tie_word_embeddings,
             "[model] tie_word_embeddings = true is not supported: DeepSeek-V3's output head is "
             "untied");
    if (c.n_routed_experts > 0) {
        MT_CHECK(c.scoring_func == "sigmoid",
                 "[model] scoring_func '{}' is not supported; DeepSeek-V3 uses 'sigmoid'",
                 c.scoring_func);
        MT_CHECK(c.topk_method == "noaux_tc",
                 "[model] topk_method '{}' is not supported; DeepSeek-V3 uses 'noaux_tc'",
                 c.topk_method);
    }
    MT_CHECK(r.batch_size >= 1 && r.seq_len >= 1,
             "[model] the runtime needs batch_size >= 1 and seq_len >= 1, got B={} S={}",
             r.batch_size, r.seq_len);
    MT_CHECK(r.seq_len <= c.max_position_embeddings,
             "[model] seq_len {} exceeds max_position_embeddings {} of model '{}'", r.seq_len,
             c.max_position_embeddings, c.name);
}

}  // namespace

std::vector<TensorSpec> model_param_specs(const ModelConfig& config) {
    std::vector<TensorSpec> specs;
    ParamBinder binder(&specs, static_cast<float>(config.initializer_range));
    ModelParams unused;
    bind_model_params(binder, unused, config);
    return specs;
}

struct Model::Impl {
    ModelConfig config;
    ModelRuntime runtime;
    LossWeights loss_weights;
    ParamTable table;
    Arena params, grads, acts;
    ModelParams w, g;  // the same tree, pointing into params and into grads

    RopeTables rope;
    std::vector<float*> residual;  // L + 1 of (N, D): the stream entering each block, and after
    std::vector<BlockActivations> layers;
    std::vector<MtpActivations> mtp;
    BlockScratch block_scratch;
    MtpScratch mtp_scratch;
    HeadScratch head;
    float* d_stream = nullptr;  // (N, D) the main stream's gradient, updated in place
    float* d_h_prev = nullptr;  // (N, D) an MTP module's gradient on its h_{d-1}

    // MoE layers ("slots"): main layers in order, then MTP blocks.
    std::vector<int64_t> main_slot, mtp_slot;       // -1 for a dense block
    std::vector<float*> slot_bias;                  // (E) each slot's correction bias
    std::vector<const int32_t*> slot_topk_ids;      // (N, K) each slot's last routing
    std::vector<std::vector<int64_t>> load_counts;  // [slot][expert]
    int64_t last_num_tokens = 0;

    Impl(const ModelConfig& c, const ModelRuntime& r, const LossWeights& lw)
        : config(c), runtime(r), loss_weights(lw), table(model_param_specs(c)) {
        ArenaPlan param_plan("params", sizeof(float));  // packed: no padding between tensors
        for (const ParamEntry& e : table.entries()) param_plan.add(e.name, e.shape);
        params = Arena(param_plan, host_memory());
        grads = Arena(param_plan, host_memory());
        ParamBinder bind_w(table, static_cast<float*>(params.base()));
        ParamBinder bind_g(table, static_cast<float*>(grads.base()));
        bind_model_params(bind_w, w, c);
        bind_model_params(bind_g, g, c);

        ArenaPlan act_plan("activations");
        bind_activations(BufferBinder(act_plan));
        acts = Arena(act_plan, host_memory());
        bind_activations(BufferBinder(acts));
        float* cos = acts.view("rope.cos").f32();
        float* sin = acts.view("rope.sin").f32();
        cpu::rope_tables(cos, sin, r.seq_len, c.qk_rope_head_dim, static_cast<float>(c.rope_theta));
        rope = {cos, sin};

        for (int64_t l = 0; l < c.num_hidden_layers; ++l)
            main_slot.push_back(add_slot(w.layers[l], layers[l]));
        for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d)
            mtp_slot.push_back(add_slot(w.mtp[d].block, mtp[d].block));
    }

    int64_t add_slot(const BlockParams& bp, const BlockActivations& ba) {
        if (!bp.is_moe) return -1;
        slot_bias.push_back(bp.moe.correction_bias);
        slot_topk_ids.push_back(ba.moe.topk_ids);
        load_counts.emplace_back(static_cast<size_t>(config.n_routed_experts), 0);
        return static_cast<int64_t>(slot_bias.size()) - 1;
    }

    // Plans (first call) or binds (second call) every activation buffer.
    void bind_activations(BufferBinder b) {
        const ModelConfig& c = config;
        const int64_t B = runtime.batch_size, S = runtime.seq_len, n = B * S, D = c.hidden_size;
        float* cos = nullptr;
        float* sin = nullptr;
        b(cos, "rope.cos", {S, c.qk_rope_head_dim / 2});
        b(sin, "rope.sin", {S, c.qk_rope_head_dim / 2});
        residual.resize(static_cast<size_t>(c.num_hidden_layers + 1));
        for (int64_t l = 0; l <= c.num_hidden_layers; ++l)
            b(residual[l], "residual." + std::to_string(l), {n, D});
        layers.resize(static_cast<size_t>(c.num_hidden_layers));
        for (int64_t l = 0; l < c.num_hidden_layers; ++l)
            bind_block_activations(b, layers[l], main_layer_prefix(l), c, c.is_moe_layer(l), B, S);
        mtp.resize(static_cast<size_t>(c.num_nextn_predict_layers));
        for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d)
            bind_mtp_activations(b, mtp[d], mtp_prefix(d), c, d, B, S);
        bind_block_scratch(b, block_scratch, "scratch.block.", c, n);
        if (c.num_nextn_predict_layers > 0) bind_mtp_scratch(b, mtp_scratch, "scratch.mtp.", c, n);
        bind_head_scratch(b, head, c, n);
        b(d_stream, "d_stream", {n, D});
        b(d_h_prev, "d_h_prev", {n, D});
    }

    BlockMoeOptions moe_options(int64_t slot, bool backward, float grad_scale) {
        BlockMoeOptions o;
        o.load_counts = (backward && slot >= 0) ? load_counts[slot].data() : nullptr;
        o.balance_alpha = loss_weights.balance_alpha;
        o.balance_grad = loss_weights.balance_alpha * grad_scale;
        return o;
    }

    // The MTP modules need a backward when their losses carry weight: the MTP loss, or the balance
    // loss of an MTP block that is MoE.
    bool mtp_needs_backward() const {
        if (loss_weights.mtp_lambda != 0.0f) return true;
        if (loss_weights.balance_alpha == 0.0f) return false;
        return std::any_of(mtp_slot.begin(), mtp_slot.end(), [](int64_t s) { return s >= 0; });
    }

    void check_inputs(const int32_t* tokens, const int32_t* targets, int64_t batch,
                      int64_t seq_len) const {
        MT_CHECK(
            batch >= 1 && batch <= runtime.batch_size && seq_len >= 1 && seq_len <= runtime.seq_len,
            "[model] micro-batch B={} S={} does not fit the planned B={} S={}", batch, seq_len,
            runtime.batch_size, runtime.seq_len);
        MT_CHECK(tokens != nullptr && targets != nullptr,
                 "[model] tokens and targets are required");
        const int64_t n = batch * seq_len;
        for (int64_t i = 0; i < n; ++i) {
            MT_CHECK(tokens[i] >= 0 && tokens[i] < config.vocab_size,
                     "[model] token {} at position {} is outside the vocabulary [0, {})", tokens[i],
                     i, config.vocab_size);
            MT_CHECK(
                targets[i] == kIgnoreIndex || (targets[i] >= 0 && targets[i] < config.vocab_size),
                "[model] target {} at position {} is neither -1 nor in [0, {})", targets[i], i,
                config.vocab_size);
        }
    }

    MicroBatchLosses run(const int32_t* tokens, const int32_t* targets, int64_t batch,
                         int64_t seq_len, bool backward, float grad_scale) {
        check_inputs(tokens, targets, batch, seq_len);
        const ModelConfig& c = config;
        const int64_t n = batch * seq_len, D = c.hidden_size, L = c.num_hidden_layers;
        const int64_t num_mtp = c.num_nextn_predict_layers;
        last_num_tokens = n;
        MicroBatchLosses losses;

        // Forward: embedding and main blocks.
        cpu::embedding_forward(residual[0], tokens, w.embed, n, c.vocab_size, D);
        for (int64_t l = 0; l < L; ++l) {
            losses.balance_loss += block_forward(
                residual[l + 1], layers[l], residual[l], w.layers[l], block_scratch, rope, c,
                moe_options(main_slot[l], backward, grad_scale), batch, seq_len);
        }

        // MTP depths, each with its loss (and that loss's head backward) right away.
        const bool run_mtp_backward = backward && mtp_needs_backward();
        const float mtp_loss_grad =
            num_mtp > 0 ? grad_scale * loss_weights.mtp_lambda / static_cast<float>(num_mtp) : 0;
        for (int64_t d = 0; d < num_mtp; ++d) {
            const float* h_prev = d == 0 ? residual[L] : mtp[d - 1].out;
            losses.balance_loss += mtp_forward(
                mtp[d], h_prev, tokens, targets, w.embed, w.mtp[d], mtp_scratch, block_scratch,
                rope, c, moe_options(mtp_slot[d], backward, grad_scale), d, batch, seq_len);
            const cpu::CrossEntropyResult ce =
                head_loss(run_mtp_backward ? mtp[d].d_out : nullptr, mtp[d].out, mtp[d].targets,
                          w.mtp[d].final_norm, g.mtp[d].final_norm, w.head, g.head, head, c, n,
                          mtp_loss_grad);
            losses.mtp_loss += ce.mean();
        }
        if (num_mtp > 0) losses.mtp_loss /= static_cast<double>(num_mtp);

        // Main head last, so that logits() holds its logits after forward().
        const cpu::CrossEntropyResult main_ce =
            head_loss(backward ? d_stream : nullptr, residual[L], targets, w.final_norm,
                      g.final_norm, w.head, g.head, head, c, n, grad_scale);
        losses.lm_loss = main_ce.mean();
        losses.num_tokens = main_ce.num_valid;
        if (!backward) return losses;

        // Backward: MTP depths in reverse; depth d's gradient on h_{d-1} joins depth d-1's output
        // gradient, and depth 1's joins the main stream.
        if (run_mtp_backward) {
            for (int64_t d = num_mtp - 1; d >= 0; --d) {
                const float* h_prev = d == 0 ? residual[L] : mtp[d - 1].out;
                mtp_backward_one(d, h_prev, batch, seq_len, grad_scale);
                cpu::add_inplace(d == 0 ? d_stream : mtp[d - 1].d_out, d_h_prev, n * D);
            }
        }
        for (int64_t l = L - 1; l >= 0; --l) {
            block_backward(d_stream, g.layers[l], residual[l], layers[l], w.layers[l],
                           block_scratch, rope, c, moe_options(main_slot[l], false, grad_scale),
                           batch, seq_len);
        }
        cpu::embedding_backward(g.embed, d_stream, tokens, n, c.vocab_size, D);
        return losses;
    }

    void mtp_backward_one(int64_t d, const float* h_prev, int64_t batch, int64_t seq_len,
                          float grad_scale) {
        mtp_backward(d_h_prev, g.mtp[d], g.embed, h_prev, mtp[d], w.mtp[d], mtp_scratch,
                     block_scratch, rope, config, moe_options(mtp_slot[d], false, grad_scale),
                     batch, seq_len);
    }
};

Model::Model(const ModelConfig& config, const ModelRuntime& runtime, const LossWeights& weights) {
    check_model_config(config, runtime);
    impl_ = std::make_unique<Impl>(config, runtime, weights);
}

Model::~Model() = default;

void Model::init_parameters(uint64_t seed) {
    impl_->table.initialize(params(), seed);
}

MicroBatchLosses Model::forward_backward(const int32_t* tokens, const int32_t* targets,
                                         int64_t batch, int64_t seq_len, float grad_scale) {
    return impl_->run(tokens, targets, batch, seq_len, true, grad_scale);
}

MicroBatchLosses Model::forward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                                int64_t seq_len) {
    return impl_->run(tokens, targets, batch, seq_len, false, 0.0f);
}

const float* Model::logits() const {
    return impl_->head.logits;
}

void Model::zero_grads() {
    impl_->grads.zero();
}

std::vector<int32_t> Model::last_routing() const {
    const int64_t per_slot = impl_->last_num_tokens * impl_->config.num_experts_per_tok;
    std::vector<int32_t> out;
    out.reserve(impl_->slot_topk_ids.size() * static_cast<size_t>(per_slot));
    for (const int32_t* ids : impl_->slot_topk_ids) out.insert(out.end(), ids, ids + per_slot);
    return out;
}

void Model::update_router_bias(float gamma) {
    const int64_t E = impl_->config.n_routed_experts;
    for (size_t slot = 0; slot < impl_->load_counts.size(); ++slot) {
        std::vector<int64_t>& counts = impl_->load_counts[slot];
        int64_t total = 0;
        for (int64_t x : counts) total += x;
        const double mean = static_cast<double>(total) / static_cast<double>(E);
        // DeepSeek-V3 sec. 2.1.2: decrease the bias of overloaded experts by gamma, increase it
        // for underloaded ones (bias_update_speed).
        float* bias = impl_->slot_bias[slot];
        for (int64_t e = 0; e < E; ++e) {
            const double gap = mean - static_cast<double>(counts[e]);
            bias[e] += gamma * static_cast<float>((gap > 0) - (gap < 0));
        }
        std::fill(counts.begin(), counts.end(), 0);
    }
}

ExpertLoadStats Model::expert_load() const {
    ExpertLoadStats stats;
    stats.tokens_per_expert = impl_->load_counts;
    double worst_min = std::numeric_limits<double>::infinity();
    for (const std::vector<int64_t>& counts : impl_->load_counts) {
        int64_t total = 0;
        for (int64_t x : counts) total += x;
        if (total == 0) continue;
        const double mean = static_cast<double>(total) / static_cast<double>(counts.size());
        const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
        stats.max_over_mean = std::max(stats.max_over_mean, static_cast<double>(*hi) / mean);
        worst_min = std::min(worst_min, static_cast<double>(*lo) / mean);
    }
    stats.min_over_mean = std::isinf(worst_min) ? 0.0 : worst_min;
    return stats;
}

const ModelConfig& Model::config() const {
    return impl_->config;
}
const LossWeights& Model::loss_weights() const {
    return impl_->loss_weights;
}
float* Model::params() {
    return static_cast<float*>(impl_->params.base());
}
float* Model::grads() {
    return static_cast<float*>(impl_->grads.base());
}
int64_t Model::num_params() const {
    return impl_->table.total_numel();
}
const std::vector<ParamEntry>& Model::param_entries() const {
    return impl_->table.entries();
}

TensorView Model::param(const std::string& name) const {
    const ParamEntry& e = impl_->table.entry(name);
    return {static_cast<float*>(impl_->params.base()) + e.offset, e.shape, DType::f32};
}

TensorView Model::grad(const std::string& name) const {
    const ParamEntry& e = impl_->table.entry(name);
    return {static_cast<float*>(impl_->grads.base()) + e.offset, e.shape, DType::f32};
}

size_t Model::planned_bytes() const {
    return impl_->params.size_bytes() + impl_->grads.size_bytes() + impl_->acts.size_bytes();
}

}  // namespace moetron
