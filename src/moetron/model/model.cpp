// The whole model: embedding -> blocks -> final norm -> head -> cross-entropy, the MTP modules on
// the last hidden state, and the backward through all of it (DESIGN.md sec. 2).
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
//
// Expert parallelism: this rank's tree binds only its ExpertShard of each MoE layer's experts, and
// one ExpertDispatcher (one slot per MoE layer) moves the token copies over the EP group.
//
// Tensor parallelism (ModelParallel::tp, with sequence parallelism): the residual stream, the
// MTP modules' inputs and every norm hold this rank's N/tp token rows (block.h); the embedding,
// the head and the cross-entropy are vocabulary-parallel (vocab_parallel.h); the losses come out
// the same on every TP rank.
//
// Pipeline parallelism (ModelParallel::pipeline_chunks): the rank holds and runs one or more
// chunks of the blocks above (model/pipeline_layout.h); stage_forward and stage_backward are the
// two halves of forward_backward, each on one of its chunk's activation sets (and dispatcher
// slots; pipeline_in_flight of them per chunk), so that a schedule (train/pipeline_schedule.h)
// can run several micro-batches' forwards before their backwards. MoE slots keep the whole model's
// numbering, so expert loads summed over the world line up layer by layer.
#include "moetron/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "moetron/core/rng.h"
#include "moetron/core/user_error.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/expert_dispatcher.h"
#include "moetron/parallel/replica_gradients.h"
#include "moetron/parallel/tensor_parallel.h"

#include "moetron/kernels/backend.h"
#include "moetron/model/block.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/mtp.h"
#include "moetron/model/vocab_parallel.h"

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

// An unbound tree whose MoE layers hold `shard` of the routed experts (bind_moe_params reads it).
ModelParams sharded_tree(const ModelConfig& c, const ExpertShard& shard) {
    ModelParams p;
    p.layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (BlockParams& layer : p.layers) layer.moe.experts = shard;
    p.mtp.resize(static_cast<size_t>(c.num_nextn_predict_layers));
    for (MtpParams& m : p.mtp) m.block.moe.experts = shard;
    return p;
}

// Vocabulary-parallel over TP (vocab_parallel.h): each rank holds V/tp rows of the embedding and
// of the head.
void bind_embedding_params(ParamBinder& b, ModelParams& p, const ModelConfig& c) {
    b.column_parallel_weight(p.embed, "embed", {c.vocab_size, c.hidden_size});
}
void bind_output_params(ParamBinder& b, ModelParams& p, const ModelConfig& c) {
    b.norm(p.final_norm, "final_norm", c.hidden_size);
    b.column_parallel_weight(p.head, "head", {c.vocab_size, c.hidden_size});
}

// The chunk that is the whole model: what a Model without pipelining runs.
PipelineChunk whole_model_chunk(const ModelConfig& c) {
    return {.embedding = true,
            .first_layer = 0,
            .num_layers = c.num_hidden_layers,
            .first_mtp = 0,
            .num_mtp = c.num_nextn_predict_layers,
            .loss = true};
}

template <class Pred>
bool any_chunk(const std::vector<PipelineChunk>& chunks, Pred pred) {
    return std::any_of(chunks.begin(), chunks.end(), pred);
}

// Binds the parameters of `chunks` (in model order) in p, whose vectors sharded_tree() sized; the
// rest stay null. The entries come in the whole model's order whatever the chunks.
void bind_model_params(ParamBinder& b, ModelParams& p, const ModelConfig& c,
                       const std::vector<PipelineChunk>& chunks) {
    // The MTP modules embed their shifted tokens with the main model's embedding: a stage of MTP
    // modules without the embedding holds a copy of it (Megatron-LM's shared embedding).
    if (any_chunk(chunks, [](const PipelineChunk& k) { return k.embedding || k.num_mtp > 0; }))
        bind_embedding_params(b, p, c);
    for (const PipelineChunk& chunk : chunks)
        for (int64_t l = chunk.first_layer; l < chunk.first_layer + chunk.num_layers; ++l)
            bind_block_params(b, p.layers[l], main_layer_prefix(l), c, c.is_moe_layer(l));
    if (any_chunk(chunks, [](const PipelineChunk& k) { return k.loss; }))
        bind_output_params(b, p, c);
    for (const PipelineChunk& chunk : chunks)
        for (int64_t d = chunk.first_mtp; d < chunk.first_mtp + chunk.num_mtp; ++d)
            bind_mtp_params(b, p.mtp[d], mtp_prefix(d), c, d);
}

// The routed experts of the first rank of an EP group of ep (every rank holds as many).
ExpertShard first_expert_shard(const ModelConfig& c, int64_t ep) {
    if (ep == 1 || c.n_routed_experts == 0) return {};
    MT_CHECK(ep >= 1 && c.n_routed_experts % ep == 0,
             "[model] the {} routed experts of model '{}' do not split over ep {}",
             c.n_routed_experts, c.name, ep);
    return {0, c.n_routed_experts / ep};
}

RankParamCount count_specs(const std::vector<TensorSpec>& specs) {
    RankParamCount n;
    for (const TensorSpec& s : specs) {
        (is_routed_expert_param(s.name) ? n.expert : n.dense) += s.numel();
        if (!s.trainable) n.untrained += s.numel();
    }
    return n;
}

std::vector<TensorSpec> sharded_param_specs(const ModelConfig& c, const ExpertShard& shard,
                                            int tp_rank, int tp_size,
                                            const std::vector<PipelineChunk>& chunks) {
    std::vector<TensorSpec> specs;
    ParamBinder binder(&specs, static_cast<float>(c.initializer_range));
    binder.set_tensor_parallel(tp_rank, tp_size);
    ModelParams tree = sharded_tree(c, shard);
    bind_model_params(binder, tree, c, chunks);
    return specs;
}

ExpertShard expert_shard_of(const ModelConfig& c, const ModelParallel& parallel) {
    const int64_t redundant = parallel.moe.redundant_experts;
    MT_USER_CHECK(redundant == 0 ||
                      (c.n_routed_experts > 0 && parallel.ep != nullptr && parallel.ep->size() > 1),
                  "--redundant-experts {} needs routed experts split over an expert-parallel "
                  "group of more than one rank (e.g. --layout ep2); model '{}' has {} routed "
                  "experts and ep {}",
                  redundant, c.name, c.n_routed_experts,
                  parallel.ep != nullptr ? parallel.ep->size() : 1);
    if (redundant > 0)
        parallel::check_placement_shape(
            {c.n_routed_experts, c.n_routed_experts + redundant, parallel.ep->size()});
    if (parallel.ep == nullptr || parallel.ep->size() == 1 || c.n_routed_experts == 0) return {};
    const int64_t ep = parallel.ep->size();
    MT_CHECK(c.n_routed_experts % ep == 0,
             "[model] the {} routed experts of model '{}' do not split over the EP group '{}' of "
             "{} ranks",
             c.n_routed_experts, c.name, parallel.ep->name(), ep);
    // Every rank routes its own tokens with replicated router biases: they stay alike only if the
    // loads they move by are summed over all of those ranks.
    MT_CHECK(parallel.load != nullptr && parallel.load->size() >= ep,
             "[model] expert parallelism over '{}' needs ModelParallel::load: the group over which "
             "expert loads are summed (every rank that routes different tokens)",
             parallel.ep->name());
    if (parallel.moe.redundant_experts > 0) {  // physical slots: (E + R) / ep per rank
        // The replicas' gradients are summed in the last micro-batch's backward, which under an
        // interleaved pipeline does not cover every chunk of the rank.
        MT_USER_CHECK(parallel.pipeline_chunks.empty(),
                      "--redundant-experts does not run under pipeline parallelism yet: use a "
                      "layout without pp, or leave out --redundant-experts");
        const int64_t slots = c.n_routed_experts + parallel.moe.redundant_experts;
        const int64_t local = slots / ep;
        return {parallel.ep->rank() * local, local, slots};
    }
    const int64_t local = c.n_routed_experts / ep;
    return {parallel.ep->rank() * local, local};
}

// The shape of the redundant experts' placement over the EP group: its domains, and the router's
// groups that hierarchical placement keeps inside them.
parallel::PlacementShape placement_shape(const ModelConfig& c, const ModelParallel& parallel,
                                         int64_t ep_ranks_per_domain) {
    parallel::PlacementShape s;
    s.num_experts = c.n_routed_experts;
    s.num_slots = c.n_routed_experts + parallel.moe.redundant_experts;
    s.ep_size = parallel.ep != nullptr ? parallel.ep->size() : 1;
    s.num_domains = s.ep_size / std::max<int64_t>(1, ep_ranks_per_domain);
    s.num_groups = c.n_group > 0 && c.n_routed_experts % c.n_group == 0 ? c.n_group : 1;
    return s;
}

// The EP ranks per scale-up domain, as the groups built from the Topology say.
int64_t ep_ranks_per_domain(const ModelParallel& parallel) {
    if (parallel.ep_domain != nullptr) return parallel.ep_domain->size();
    return parallel.ep != nullptr ? parallel.ep->size() : 1;
}

// two_tier over G domains: each router group's experts must live in one domain (experts are
// contiguous per rank, ranks per domain), so that topk_group bounds the domains a token reaches.
void check_domain_limited_routing(const ModelConfig& c, const parallel::ExpertDispatchConfig& dc,
                                  const ModelParallel& parallel) {
    if (dc.kind != parallel::DispatchKind::two_tier || parallel.ep == nullptr) return;
    const int64_t domains = dc.routing.num_domains(parallel.ep->size());
    MT_CHECK(domains <= 1 || c.n_group % domains == 0,
             "[model] two_tier dispatch over {} EP domains needs n_group ({}) to be a multiple of "
             "{}, so that each router group's experts live in one domain (topk_group = {} then "
             "bounds the domains a token reaches); set n_group in model '{}' or use --dispatch "
             "flat",
             domains, c.n_group, domains, c.topk_group, c.name);
}

// What the groups this Model is given need of the model: the one check of a layout against the
// model (layout_fit.h; the trainer has run it on its Topology already, a hand-built ModelParallel
// gets it here), then what a micro-batch and the load group need of tensor parallelism.
void check_groups_fit_model(const ModelConfig& c, const ModelRuntime& r,
                            const ModelParallel& parallel) {
    parallel::Topology groups;
    groups.tp = parallel.tp != nullptr ? parallel.tp->size() : 1;
    groups.ep = parallel.ep != nullptr ? parallel.ep->size() : 1;
    validate_topology_for_model(groups, c);
    const int tp = groups.tp;
    if (tp == 1) return;
    MT_CHECK(r.batch_size * r.seq_len % tp == 0,
             "[model] tp {} does not divide the {} x {} tokens of a micro-batch (sequence "
             "parallelism splits them over the TP ranks)",
             tp, r.batch_size, r.seq_len);
    MT_CHECK(c.n_routed_experts == 0 ||
                 (parallel.load != nullptr && parallel.load->size() >= parallel.tp->size()),
             "[model] tensor parallelism over '{}' with routed experts needs ModelParallel::load "
             "spanning the TP ranks: each routes its own share of the tokens",
             parallel.tp->name());
}

int64_t num_moe_slots(const ModelConfig& c) {
    int64_t slots = c.num_moe_layers();
    for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d) slots += c.mtp_layer_is_moe(d);
    return slots;
}

// The expert dispatcher's configuration for max_tokens tokens per rank: one function for the
// Model that builds the dispatcher and for plan_rank_memory, which must plan the same buffers.
parallel::ExpertDispatchConfig expert_dispatch_config(const ModelConfig& c, int64_t max_tokens,
                                                      const MoeSettings& moe,
                                                      int64_t ep_ranks_per_domain) {
    parallel::ExpertDispatchConfig dc;
    dc.routing.num_experts = c.n_routed_experts + moe.redundant_experts;  // the physical slots
    dc.routing.top_k = c.num_experts_per_tok;
    dc.routing.hidden = c.hidden_size;
    dc.routing.max_tokens = max_tokens;
    dc.routing.domain_size = ep_ranks_per_domain;
    dc.routing.token_format = moe.token_format;
    dc.capacity_factor = moe.capacity_factor;
    dc.kind = moe.dispatch;
    // Dual overlap runs two half micro-batches, each with its own routing and buffers.
    const bool dual = moe.overlap == MoeOverlap::dual;
    dc.num_buffers = dual ? 2 : 1;
    dc.num_slots = num_moe_slots(c) * (dual ? 2 : 1);
    return dc;
}

// The final norm, output head and cross-entropy; shared by the main model and the MTP depths.
// Nr: this rank's token rows, N/tp (sequence parallelism, block.h).
struct HeadScratch {
    float* normed = nullptr;    // (Nr, D)
    float* rstd = nullptr;      // (Nr)
    float* logits = nullptr;    // (N, V/tp) this rank's vocabulary part; their gradient after
                                // a backward
    float* lse = nullptr;       // (N)
    float* losses = nullptr;    // (N)
    float* d_normed = nullptr;  // (Nr, D)
    // tp > 1 only: the gathered normed rows, the head's partial input gradient over all N rows,
    // the final norm gain's partial gradient.
    float* normed_full = nullptr;    // (N, D)
    float* d_normed_full = nullptr;  // (N, D)
    float* d_norm_weight = nullptr;  // (D)
    VocabParallelScratch vocab;
};

void bind_head_scratch(BufferBinder& b, HeadScratch& s, const ModelConfig& c, int tp_size,
                       int64_t n, const std::string& prefix) {
    const int64_t D = c.hidden_size, rows = n / tp_size;
    b(s.normed, prefix + "head.normed", {rows, D});
    b(s.rstd, prefix + "head.rstd", {rows});
    b(s.logits, prefix + "head.logits", {n, c.vocab_size / tp_size});
    b(s.lse, prefix + "head.lse", {n});
    b(s.losses, prefix + "head.losses", {n});
    b(s.d_normed, prefix + "head.d_normed", {rows, D});
    if (tp_size > 1) {
        b(s.normed_full, prefix + "head.normed_full", {n, D});
        b(s.d_normed_full, prefix + "head.d_normed_full", {n, D});
        b(s.d_norm_weight, prefix + "head.d_norm_weight", {D});
    }
    bind_vocab_parallel_scratch(b, s.vocab, prefix + "head.vocab.", tp_size, n);
}

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
    return sharded_param_specs(config, {}, 0, 1, {whole_model_chunk(config)});
}

RankParamCount& RankParamCount::operator+=(const RankParamCount& other) {
    dense += other.dense;
    expert += other.expert;
    untrained += other.untrained;
    return *this;
}

RankParamCount rank_param_count(const ModelConfig& c, ModelPart part, int64_t tp, int64_t ep) {
    MT_CHECK(tp >= 1 && tp <= std::numeric_limits<int>::max(), "[model] tp {}", tp);
    std::vector<TensorSpec> specs;
    ParamBinder b(&specs, static_cast<float>(c.initializer_range));
    b.set_tensor_parallel(0, static_cast<int>(tp));
    ModelParams tree;  // the embedding's and the output's pointers only
    BlockParams layer;
    layer.moe.experts = first_expert_shard(c, ep);
    switch (part) {
        case ModelPart::embedding:
            bind_embedding_params(b, tree, c);
            break;
        case ModelPart::dense_layer:
        case ModelPart::moe_layer:
            bind_block_params(b, layer, main_layer_prefix(0), c, part == ModelPart::moe_layer);
            break;
        case ModelPart::output:
            bind_output_params(b, tree, c);
            break;
        case ModelPart::mtp_extra: {
            // bind_mtp_params lists the module's own tensors around its block: count the
            // module, then take the block away.
            MtpParams mtp;
            mtp.block.moe.experts = first_expert_shard(c, ep);
            bind_mtp_params(b, mtp, mtp_prefix(0), c, 0);
            RankParamCount module = count_specs(specs);
            specs.clear();
            bind_block_params(b, layer, mtp_prefix(0), c, c.mtp_layer_is_moe(0));
            const RankParamCount block = count_specs(specs);
            module.dense -= block.dense;
            module.expert -= block.expert;
            module.untrained -= block.untrained;
            return module;
        }
    }
    return count_specs(specs);
}

RankParamCount rank_param_count(const ModelConfig& c, int64_t tp, int64_t ep) {
    RankParamCount n = rank_param_count(c, ModelPart::embedding, tp, ep);
    const RankParamCount dense = rank_param_count(c, ModelPart::dense_layer, tp, ep);
    const RankParamCount moe = rank_param_count(c, ModelPart::moe_layer, tp, ep);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) n += c.is_moe_layer(l) ? moe : dense;
    n += rank_param_count(c, ModelPart::output, tp, ep);
    const RankParamCount mtp_extra = rank_param_count(c, ModelPart::mtp_extra, tp, ep);
    for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d) {
        n += c.mtp_layer_is_moe(d) ? moe : dense;
        n += mtp_extra;
    }
    return n;
}

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

namespace {

// [begin, end) of the flat buffer, in floats.
struct FloatRange {
    int64_t begin = 0;
    int64_t end = 0;
};

// The range of the entries accepted by `member`; throws when they are not contiguous (the
// readiness notifications rely on each group being one range).
template <class Member>
FloatRange entries_range(const ParamTable& table, const std::string& what, Member member) {
    FloatRange r{std::numeric_limits<int64_t>::max(), 0};
    int64_t numel = 0;
    for (const ParamEntry& e : table.entries()) {
        if (!member(e.name)) continue;
        r.begin = std::min(r.begin, e.offset);
        r.end = std::max(r.end, e.offset + e.numel);
        numel += e.numel;
    }
    if (numel == 0) return {};
    MT_CHECK(r.end - r.begin == numel, "[model] the parameters of {} are not contiguous", what);
    return r;
}

}  // namespace

namespace {

// The activation arena's tensors: what bind_model_activations plans or binds.
struct ActivationSet {
    // (N) the micro-batch's tokens and targets, copied from the caller's host memory.
    int32_t* input_tokens = nullptr;
    int32_t* input_targets = nullptr;
    float* rope_cos = nullptr;  // (S, rope_dim / 2)
    float* rope_sin = nullptr;
    std::vector<float*> residual;  // L + 1 of (N, D): the stream entering each block, and after
    std::vector<BlockActivations> layers;
    std::vector<MtpActivations> mtp;
    BlockScratch block_scratch;
    MtpScratch mtp_scratch;
    HeadScratch head;
    float* d_stream = nullptr;  // (N, D) the main stream's gradient, updated in place
    float* d_h_prev = nullptr;  // (N, D) an MTP module's gradient on its h_{d-1}
};

// Plans (a BufferBinder over a plan) or binds (over the arena) every activation buffer of
// `chunk`, names prefixed with `prefix` (one set per micro-batch in flight); the other layers'
// stay null. expert_rows: R of every MoE layer's expert-side buffers (the dispatcher's
// capacity_rows).
void bind_model_activations(BufferBinder b, ActivationSet& a, const ModelConfig& c,
                            const ModelRuntime& runtime, int tp_size, int64_t expert_rows,
                            const std::vector<PipelineChunk>& chunks,
                            const std::string& prefix = "") {
    const int64_t B = runtime.batch_size, S = runtime.seq_len, n = B * S, D = c.hidden_size;
    const int64_t rows = n / tp_size;  // the stream's token rows on this rank
    b(a.input_tokens, prefix + "input.tokens", {n});
    b(a.input_targets, prefix + "input.targets", {n});
    b(a.rope_cos, prefix + "rope.cos", {S, c.qk_rope_head_dim / 2});
    b(a.rope_sin, prefix + "rope.sin", {S, c.qk_rope_head_dim / 2});
    a.residual.assign(static_cast<size_t>(c.num_hidden_layers + 1), nullptr);
    a.layers.resize(static_cast<size_t>(c.num_hidden_layers));
    a.mtp.resize(static_cast<size_t>(c.num_nextn_predict_layers));
    for (const PipelineChunk& chunk : chunks) {
        const int64_t first = chunk.first_layer, last = chunk.first_layer + chunk.num_layers;
        for (int64_t l = first; l <= last; ++l)
            b(a.residual[l], prefix + "residual." + std::to_string(l), {rows, D});
        for (int64_t l = first; l < last; ++l) {
            a.layers[l].moe.expert_rows = expert_rows;
            bind_block_activations(b, a.layers[l], prefix + main_layer_prefix(l), c,
                                   c.is_moe_layer(l), tp_size, B, S);
        }
        for (int64_t d = chunk.first_mtp; d < chunk.first_mtp + chunk.num_mtp; ++d) {
            a.mtp[d].block.moe.expert_rows = expert_rows;
            bind_mtp_activations(b, a.mtp[d], prefix + mtp_prefix(d), c, d, tp_size, B, S);
        }
    }
    a.block_scratch.moe.expert_rows = expert_rows;
    bind_block_scratch(b, a.block_scratch, prefix + "scratch.block.", c, tp_size, n);
    if (any_chunk(chunks, [](const PipelineChunk& k) { return k.num_mtp > 0; }))
        bind_mtp_scratch(b, a.mtp_scratch, prefix + "scratch.mtp.", c, tp_size, n);
    if (any_chunk(chunks, [](const PipelineChunk& k) { return k.loss; }))
        bind_head_scratch(b, a.head, c, tp_size, n, prefix);
    b(a.d_stream, prefix + "d_stream", {rows, D});
    b(a.d_h_prev, prefix + "d_h_prev", {rows, D});
}

}  // namespace

// What a micro-batch's backward needs from its forward, kept with its activation set.
struct PassContext {
    int64_t batch = 0, seq_len = 0;
    float grad_scale = 1.0f;
    float balance_scale = 1.0f;  // this micro-batch's share of the balance loss's mean
    bool backward = false;       // the forward prepared a backward
    size_t chunk = 0;            // which of the rank's chunks ran
};

// The chunk a Model runs, checked: the MTP modules share the head of their stage (the last).
std::vector<PipelineChunk> checked_chunks(const ModelConfig& c, const ModelParallel& par) {
    if (par.pipeline_chunks.empty()) return {whole_model_chunk(c)};
    for (const PipelineChunk& chunk : par.pipeline_chunks)
        MT_USER_CHECK(chunk.num_mtp == 0 || chunk.loss,
                      "[model] a pipeline chunk that runs MTP modules needs the head (L) too");
    MT_CHECK(par.pipeline_in_flight.empty() ||
                 par.pipeline_in_flight.size() == par.pipeline_chunks.size(),
             "[model] pipeline_in_flight has {} counts for {} chunks",
             par.pipeline_in_flight.size(), par.pipeline_chunks.size());
    for (int64_t n : par.pipeline_in_flight)
        MT_CHECK(n >= 1, "[model] a pipeline chunk needs at least one activation set, got {}", n);
    return par.pipeline_chunks;
}

// Which chunk each activation set serves: pipeline_in_flight[c] sets for chunk c, in chunk order.
std::vector<size_t> sets_by_chunk(const ModelParallel& par, size_t num_chunks) {
    std::vector<size_t> out;
    for (size_t c = 0; c < num_chunks; ++c) {
        const int64_t n = par.pipeline_in_flight.empty() ? 1 : par.pipeline_in_flight[c];
        out.insert(out.end(), static_cast<size_t>(n), c);
    }
    return out;
}

struct Model::Impl {
    Backend& ops;          // runs every op; owns the arenas' memory
    ModelCompute compute;  // ops, and the format of each GEMM (compute.h)
    ModelConfig config;
    ModelRuntime runtime;
    LossWeights loss_weights;
    ModelParallel parallel;
    std::vector<PipelineChunk> chunks;  // the blocks this rank runs, in model order
    parallel::TensorParallel tp;        // declared before table: the specs read it
    ExpertShard shard;
    // Redundant experts (MoeSettings::redundant_experts): which logical expert each slot holds,
    // and the sum of the replicas' gradients, which arm_replica_gradient_sum() turns on for the
    // next backward (the last micro-batch's: the gradients are then whole).
    // One placement per MoE layer (the load slots' order: main layers, then MTP blocks; empty
    // without redundant experts), and the MoE layer of each parameter entry (-1: none).
    std::vector<parallel::ExpertPlacement> placements;
    std::vector<int64_t> entry_moe_layer;
    std::optional<parallel::ReplicaGradientSum> replica_grads;
    bool replica_sum_armed = false;
    double expert_compute_s = 0;       // since the last take_expert_compute_s()
    std::vector<int64_t> expert_rows;  // (MoE layers) since the last take_expert_rows()
    ParamTable table;
    Arena params, grads, acts;
    ModelParams w, g;  // the same tree, pointing into params and into grads
    std::unique_ptr<parallel::ExpertDispatcher> dispatcher;  // null without routed experts

    // One activation set per micro-batch in flight, chunk by chunk
    // (ModelParallel::pipeline_in_flight): set k holds chunk set_chunk[k]'s activations.
    std::vector<ActivationSet> sets;
    std::vector<size_t> set_chunk;
    std::vector<int64_t> first_set;  // per chunk
    std::vector<PassContext> contexts;
    RopeTables rope;

    // MoE layers ("slots"): main layers in order, then MTP blocks, of the whole model, so that the
    // loads of every pipeline stage line up when summed; a stage counts only its own.
    std::vector<int64_t> main_slot, mtp_slot;   // -1 for a dense block
    std::vector<float*> slot_bias;              // (E) each slot's correction bias; null off-stage
    std::vector<const int32_t*> slot_topk_ids;  // (N, K) each slot's last routing (set 0)
    // Tokens routed to each expert since the last bias update, in the backend's memory: (slots,
    // E) in `loads`, load_counts[slot] its row. The host copies are for summing over ranks.
    Arena loads;
    std::vector<int64_t*> load_counts;
    std::vector<int64_t> load_host;  // (slots * E)
    std::vector<double> load_sum;    // (slots * E)
    bool load_summed = false;
    int64_t last_num_tokens = 0;

    // Gradient readiness: the parameter groups in the order their gradients become final.
    GradReadyCallback grad_ready;
    FloatRange head_range, embed_range;
    std::vector<FloatRange> layer_range, mtp_range;

    Impl(const ModelConfig& c, const ModelRuntime& r, const LossWeights& lw,
         const ModelParallel& par)
        : ops(r.backend != nullptr ? *r.backend : cpu_backend()),
          compute{ops, r.whole_backward != nullptr ? *r.whole_backward : ops, r.precision},
          config(c),
          runtime(r),
          loss_weights(lw),
          parallel(par),
          chunks(checked_chunks(c, par)),
          tp(par.tp, ops),
          shard(expert_shard_of(c, par)),
          table(sharded_param_specs(c, shard, tp.rank(), tp.size(), chunks)),
          w(sharded_tree(c, shard)),
          g(sharded_tree(c, shard)) {
        set_chunk = sets_by_chunk(par, chunks.size());
        for (size_t k = 0; k < set_chunk.size(); ++k)
            if (k == 0 || set_chunk[k] != set_chunk[k - 1])
                first_set.push_back(static_cast<int64_t>(k));
        ArenaPlan param_plan("params", sizeof(float));  // packed: no padding between tensors
        for (const ParamEntry& e : table.entries()) param_plan.add(e.name, e.shape);
        check_fits_before_allocating(param_plan);
        params = Arena(param_plan, ops.memory());
        grads = Arena(param_plan, ops.memory());
        ParamBinder bind_w(table, static_cast<float*>(params.base()));
        ParamBinder bind_g(table, static_cast<float*>(grads.base()));
        bind_w.set_tensor_parallel(tp.rank(), tp.size());
        bind_g.set_tensor_parallel(tp.rank(), tp.size());
        bind_model_params(bind_w, w, c, chunks);
        bind_model_params(bind_g, g, c, chunks);

        if (c.n_routed_experts > 0) {
            parallel::ExpertDispatchConfig dc = expert_dispatch_config(
                c, r.batch_size * r.seq_len, par.moe, ep_ranks_per_domain(par));
            // Each micro-batch in flight keeps its own routings until its backward.
            dc.num_slots *= static_cast<int64_t>(set_chunk.size());
            check_domain_limited_routing(c, dc, par);
            if (par.moe.redundant_experts > 0) {
                const parallel::PlacementShape shape =
                    placement_shape(c, par, ep_ranks_per_domain(par));
                // Sized once: the dispatcher keeps a pointer to them.
                placements.assign(static_cast<size_t>(num_moe_slots(c)),
                                  parallel::initial_placement(shape));
                replica_grads.emplace(shape, 3 * c.moe_intermediate_size * c.hidden_size);
                dc.placements = placements.data();
                dc.routing_slots_per_placement = par.moe.overlap == MoeOverlap::dual ? 2 : 1;
                map_expert_entries_to_layers();
            }
            parallel::ExpertGroups groups;
            groups.ep = shard.count > 0 ? par.ep : nullptr;
            groups.rail = par.ep_rail;
            groups.domain = par.ep_domain;
            dispatcher = parallel::make_expert_dispatcher(dc, groups, ops);
        }

        sets.resize(set_chunk.size());
        contexts.resize(sets.size());
        ArenaPlan act_plan("activations");
        bind_activations(BufferBinder(act_plan));
        acts = Arena(act_plan, ops.memory());
        bind_activations(BufferBinder(acts));
        ops.rope_tables(sets[0].rope_cos, sets[0].rope_sin, r.seq_len, c.qk_rope_head_dim,
                        static_cast<float>(c.rope_theta));
        rope = {sets[0].rope_cos, sets[0].rope_sin};

        for (int64_t l = 0; l < c.num_hidden_layers; ++l)
            main_slot.push_back(add_slot(c.is_moe_layer(l), owns_layer(l) ? &w.layers[l] : nullptr,
                                         [l](ActivationSet& a) { return &a.layers[l]; }));
        for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d)
            mtp_slot.push_back(add_slot(c.mtp_layer_is_moe(d) && c.n_routed_experts > 0,
                                        owns_mtp(d) ? &w.mtp[d].block : nullptr,
                                        [d](ActivationSet& a) { return &a.mtp[d].block; }));
        plan_expert_loads();
        plan_grad_ranges();
    }

    // The embedding is on two pipeline stages: the first, and the one of the MTP modules.
    bool shares_embedding() const {
        return !parallel.pipeline_chunks.empty() && config.num_nextn_predict_layers > 0 &&
               runs_embedding() !=
                   any_chunk(chunks, [](const PipelineChunk& k) { return k.num_mtp > 0; });
    }

    bool runs_embedding() const {
        return any_chunk(chunks, [](const PipelineChunk& k) { return k.embedding; });
    }
    bool owns_layer(int64_t l) const {
        return any_chunk(chunks, [l](const PipelineChunk& k) {
            return l >= k.first_layer && l < k.first_layer + k.num_layers;
        });
    }
    bool owns_mtp(int64_t d) const {
        return any_chunk(chunks, [d](const PipelineChunk& k) {
            return d >= k.first_mtp && d < k.first_mtp + k.num_mtp;
        });
    }

    // Numbers a MoE block of the whole model; when this rank runs it (bp not null), points each
    // activation set's block at its own dispatcher slots.
    template <class BlockOf>
    int64_t add_slot(bool is_moe, const BlockParams* bp, BlockOf block_of) {
        if (!is_moe) return -1;
        const auto slot = static_cast<int64_t>(slot_bias.size());
        const auto all_slots = static_cast<int64_t>(num_moe_slots(config));
        if (expert_rows.empty()) expert_rows.assign(static_cast<size_t>(all_slots), 0);
        const bool dual = parallel.moe.overlap == MoeOverlap::dual;
        slot_bias.push_back(bp != nullptr ? bp->moe.correction_bias : nullptr);
        slot_topk_ids.push_back(bp != nullptr ? block_of(sets[0])->moe.topk_ids : nullptr);
        if (bp == nullptr) return slot;
        MT_CHECK(bp->is_moe, "[model] MoE slot {} binds a dense block", slot);
        for (size_t k = 0; k < sets.size(); ++k) {
            BlockActivations& ba = *block_of(sets[k]);
            // dual: slots 2l and 2l+1, buffers 0 and 1; set k after the sets before it.
            const int64_t base = static_cast<int64_t>(k) * all_slots * (dual ? 2 : 1);
            ba.moe.dispatcher = dispatcher.get();
            ba.moe.expert_compute_s = &expert_compute_s;
            ba.moe.expert_rows_computed = &expert_rows[static_cast<size_t>(slot)];
            ba.moe.overlap = parallel.moe.overlap;
            ba.moe.token_format = parallel.moe.token_format;
            ba.moe.dispatch_slot = base + (dual ? 2 * slot : slot);
            ba.moe.dispatch_slot_b = dual ? base + 2 * slot + 1 : -1;
        }
        return slot;
    }

    // One row of E counts per slot, zeroed (arenas are allocated zero-filled).
    void plan_expert_loads() {
        const int64_t slots = static_cast<int64_t>(slot_bias.size()), E = config.n_routed_experts;
        if (slots == 0) return;
        ArenaPlan plan("expert_load");
        plan.add("counts", {slots, E}, DType::i64);
        loads = Arena(plan, ops.memory());
        for (int64_t slot = 0; slot < slots; ++slot)
            load_counts.push_back(static_cast<int64_t*>(loads.base()) + slot * E);
        load_host.resize(static_cast<size_t>(slots * E));
        load_sum.resize(load_host.size());
    }

    void plan_grad_ranges() {
        const ModelConfig& c = config;
        int64_t covered = 0;
        auto add = [&covered](FloatRange r) {
            covered += r.end - r.begin;
            return r;
        };
        head_range = add(entries_range(table, "the head and final norm", [](const std::string& n) {
            return n == "final_norm" || n == "head";
        }));
        embed_range = add(entries_range(table, "the embedding",
                                        [](const std::string& n) { return n == "embed"; }));
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
            const std::string prefix = main_layer_prefix(l);
            layer_range.push_back(add(entries_range(
                table, prefix, [&prefix](const std::string& n) { return n.starts_with(prefix); })));
        }
        for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d) {
            const std::string prefix = mtp_prefix(d);
            mtp_range.push_back(add(entries_range(
                table, prefix, [&prefix](const std::string& n) { return n.starts_with(prefix); })));
        }
        MT_CHECK(covered == table.total_numel(),
                 "[model] the gradient-readiness groups cover {} of {} parameters", covered,
                 table.total_numel());
    }

    void notify_grads_ready(const FloatRange& r) const {
        if (grad_ready && r.end > r.begin) grad_ready(r.begin, r.end);
    }

    void bind_activations(const BufferBinder& b) {
        const int64_t expert_rows = dispatcher ? dispatcher->capacity_rows() : 0;
        for (size_t k = 0; k < sets.size(); ++k)
            bind_model_activations(b, sets[k], config, runtime, tp.size(), expert_rows,
                                   {chunks[set_chunk[k]]},
                                   k == 0 ? std::string() : fmt::format("set{}.", k));
    }

    // Memory that cannot possibly fit is refused before the first allocation, with its size: the
    // parameters, their gradients and the residual stream (a lower bound of the activations; the
    // exact activation arena is planned later and checked again when allocated).
    void check_fits_before_allocating(const ArenaPlan& param_plan) const {
        const int64_t rows = checked_product({runtime.batch_size, runtime.seq_len},
                                             "[model] tokens per micro-batch") /
                             tp.size();
        const size_t residual_bytes = static_cast<size_t>(checked_product(
            {config.num_hidden_layers + 1, rows, config.hidden_size, int64_t{sizeof(float)}},
            "[model] bytes of the residual stream"));
        const size_t total_bytes =
            checked_add(2 * param_plan.total_bytes(), residual_bytes, "[model] planned bytes");
        check_fits_in_host_memory(
            total_bytes,
            fmt::format("[model] the model ({} of parameters and gradients) with batch_size {} x "
                        "seq_len {} (at least {} of activations)",
                        format_bytes(2.0 * static_cast<double>(param_plan.total_bytes())),
                        runtime.batch_size, runtime.seq_len,
                        format_bytes(static_cast<double>(residual_bytes))),
            "lower --batch-size or --seq-len, or use a smaller model");
    }

    // balance_scale turns the balance loss's mean over this micro-batch's sequences into its share
    // of the mean over the denominators' sequences.
    BlockMoeOptions moe_options(int64_t slot, bool backward, float grad_scale,
                                float balance_scale) {
        BlockMoeOptions o;
        o.load_counts = (backward && slot >= 0) ? load_counts[slot] : nullptr;
        o.balance_alpha = loss_weights.balance_alpha * balance_scale;
        o.balance_grad = loss_weights.balance_alpha * grad_scale * balance_scale;
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

    void check_denominators(const LossDenominators& den, const int32_t* targets, int64_t batch,
                            int64_t seq_len) const {
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
    MicroBatchLosses forward_pass(size_t ci, size_t k, const int32_t* tokens,
                                  const int32_t* targets, int64_t batch, int64_t seq_len,
                                  bool backward, float grad_scale, const LossDenominators* den) {
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
            losses.balance_loss += block_forward(
                compute, a.residual[l + 1], a.layers[l], a.residual[l], w.layers[l],
                a.block_scratch, rope, c, tp, moe(main_slot[l], backward), batch, seq_len);
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
                          a.mtp[d].targets, w.mtp[d].final_norm, g.mtp[d].final_norm, w.head,
                          g.head, a.head, c, tp, n, mtp_loss_grad, mtp_den);
            losses.mtp_loss += mean_loss(ce, mtp_den);
        }
        if (num_mtp > 0) losses.mtp_loss /= static_cast<double>(num_mtp);

        // Main head last, so that logits() holds its logits after forward().
        const int64_t lm_den = den == nullptr ? 0 : den->lm_tokens;
        const CrossEntropyResult main_ce = head_loss(
            compute, backward ? a.d_stream : nullptr, a.residual[L], a.input_targets, w.final_norm,
            g.final_norm, w.head, g.head, a.head, c, tp, n, grad_scale, lm_den);
        losses.lm_loss = mean_loss(main_ce, lm_den);
        losses.num_tokens = main_ce.num_valid;
        return losses;
    }

    // The backward of the micro-batch in activation set k. On the chunk with the loss the
    // forward left the head's gradient in d_stream; elsewhere the next stage's is there.
    void backward_pass(size_t k) {
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
                                 a.mtp_scratch, a.block_scratch, rope, c, tp, moe(mtp_slot[d]),
                                 batch, seq_len);
                    ops.add_inplace(d == 0 ? a.d_stream : a.mtp[d - 1].d_out, a.d_h_prev,
                                    tp.local_rows(n) * D);
                }
                sum_replica_grads(g.mtp[d].block, mtp_slot[d]);
                notify_grads_ready(mtp_range[d]);
            }
        }
        for (int64_t l = chunk.first_layer + chunk.num_layers - 1; l >= chunk.first_layer; --l) {
            block_backward(compute, a.d_stream, g.layers[l], a.residual[l], a.layers[l],
                           w.layers[l], a.block_scratch, rope, c, tp, moe(main_slot[l]), batch,
                           seq_len);
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

    MicroBatchLosses run(const int32_t* tokens, const int32_t* targets, int64_t batch,
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

    static double mean_loss(const CrossEntropyResult& ce, int64_t denominator) {
        if (denominator <= 0) return ce.mean();
        return ce.loss_sum / static_cast<double>(denominator);
    }

    void sum_loads() {
        if (load_summed) return;
        load_summed = true;
        if (parallel.load == nullptr || parallel.load->size() == 1) return;
        ops.copy_to_host(load_host.data(), loads.base(), load_host.size() * sizeof(int64_t));
        for (size_t i = 0; i < load_host.size(); ++i)
            load_sum[i] = static_cast<double>(load_host[i]);
        // Counts are far below 2^53, so the sum in doubles is exact.
        parallel.load->all_reduce_sum(load_sum.data(), load_sum.size(), DType::f64, kHostStream);
        for (size_t i = 0; i < load_host.size(); ++i)
            load_host[i] = static_cast<int64_t>(load_sum[i]);
        ops.copy_from_host(loads.base(), load_host.data(), load_host.size() * sizeof(int64_t));
    }

    // The routed experts' entries come two per MoE layer (gate_up, down), in the layers' order:
    // main layers, then MTP blocks (bind_model_params), as the load slots.
    void map_expert_entries_to_layers() {
        entry_moe_layer.assign(table.entries().size(), -1);
        int64_t k = 0;
        for (size_t i = 0; i < table.entries().size(); ++i)
            if (is_routed_expert_param(table.entries()[i].name)) entry_moe_layer[i] = k++ / 2;
        MT_CHECK(k == 2 * static_cast<int64_t>(placements.size()),
                 "[model] {} routed expert tensors for {} MoE layers", k, placements.size());
    }

    void init_expert_shard(uint64_t seed) {
        if (!placements.empty()) return init_expert_slots(seed);
        if (shard.first == 0) return;  // the first shard's global indices are its local ones
        for (size_t i = 0; i < table.specs().size(); ++i) {
            const TensorSpec& spec = table.specs()[i];
            if (!is_routed_expert_param(spec.name)) continue;
            const ParamEntry& e = table.entries()[i];
            const int64_t per_expert = e.numel / shard.count;
            ops.init_normal(static_cast<float*>(params.base()) + e.offset, seed,
                            fnv1a_64(spec.name), 1, e.numel, shard.first * per_expert, 0,
                            spec.init_stddev);
        }
    }

    // Redundant experts: each local slot gets the numbers of the logical expert it holds, so
    // that replicas start identical and equal to that expert in a run without them.
    void init_expert_slots(uint64_t seed) {
        for (size_t i = 0; i < table.specs().size(); ++i) {
            const TensorSpec& spec = table.specs()[i];
            if (!is_routed_expert_param(spec.name)) continue;
            const ParamEntry& e = table.entries()[i];
            const int64_t per_expert = e.numel / shard.count;
            const parallel::ExpertPlacement& placement =
                placements[static_cast<size_t>(entry_moe_layer[i])];
            for (int64_t local = 0; local < shard.count; ++local) {
                const int64_t expert =
                    placement.slot_expert[static_cast<size_t>(shard.first + local)];
                ops.init_normal(static_cast<float*>(params.base()) + e.offset + local * per_expert,
                                seed, fnv1a_64(spec.name), 1, per_expert, expert * per_expert, 0,
                                spec.init_stddev);
            }
        }
    }

    // After a MoE block's backward on the armed (last) micro-batch: its replicas' gradients
    // summed over the EP group (a collective over it; every rank runs the same blocks).
    void sum_replica_grads(const BlockParams& grads, int64_t moe_layer) {
        if (!replica_sum_armed || !grads.is_moe) return;
        const int64_t F = config.moe_intermediate_size, D = config.hidden_size;
        const parallel::SlotTensor tensors[] = {{grads.moe.experts_gate_up, 2 * F * D},
                                                {grads.moe.experts_down, D * F}};
        replica_grads->sum(placements[static_cast<size_t>(moe_layer)], tensors, *parallel.ep);
    }
};

Model::Model(const ModelConfig& config, const ModelRuntime& runtime, const LossWeights& weights,
             const ModelParallel& parallel) {
    check_model_config(config, runtime);
    check_groups_fit_model(config, runtime, parallel);
    impl_ = std::make_unique<Impl>(config, runtime, weights, parallel);
}

Model::~Model() = default;

void Model::init_parameters(uint64_t seed) {
    impl_->table.initialize(impl_->ops, params(), seed);
    impl_->init_expert_shard(seed);
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

void Model::set_grad_ready_callback(GradReadyCallback callback) {
    impl_->grad_ready = std::move(callback);
}

const GradReadyCallback& Model::grad_ready_callback() const {
    return impl_->grad_ready;
}

MicroBatchLosses Model::stage_forward(int64_t chunk, int64_t set, const int32_t* tokens,
                                      const int32_t* targets, int64_t batch, int64_t seq_len,
                                      const LossDenominators* denominators) {
    return impl_->forward_pass(static_cast<size_t>(chunk), static_cast<size_t>(set), tokens,
                               targets, batch, seq_len, denominators != nullptr, 1.0f,
                               denominators);
}

void Model::stage_backward(int64_t set) {
    impl_->backward_pass(static_cast<size_t>(set));
}

float* Model::stage_input(int64_t chunk, int64_t set) {
    const PipelineChunk& k = impl_->chunks.at(static_cast<size_t>(chunk));
    return impl_->sets.at(static_cast<size_t>(set)).residual[k.first_layer];
}

const float* Model::stage_output(int64_t chunk, int64_t set) const {
    const PipelineChunk& k = impl_->chunks.at(static_cast<size_t>(chunk));
    return impl_->sets.at(static_cast<size_t>(set)).residual[k.first_layer + k.num_layers];
}

Model::SetRange Model::stage_sets(int64_t chunk) const {
    const auto c = static_cast<size_t>(chunk);
    const auto& first = impl_->first_set;
    const int64_t end =
        c + 1 < first.size() ? first[c + 1] : static_cast<int64_t>(impl_->set_chunk.size());
    return {first.at(c), end - first.at(c)};
}

float* Model::stage_grad(int64_t set) {
    return impl_->sets.at(static_cast<size_t>(set)).d_stream;
}

int64_t Model::stage_numel(int64_t batch, int64_t seq_len) const {
    return impl_->tp.local_rows(batch * seq_len) * impl_->config.hidden_size;
}

const std::vector<PipelineChunk>& Model::pipeline_chunks() const {
    return impl_->chunks;
}

bool Model::runs_embedding() const {
    return impl_->runs_embedding();
}

bool Model::shares_embedding() const {
    return impl_->shares_embedding();
}

const float* Model::logits() const {
    return impl_->sets[0].head.logits;
}

void Model::zero_grads() {
    impl_->grads.zero();
}

std::vector<int32_t> Model::last_routing() const {
    const int64_t per_slot = impl_->last_num_tokens * impl_->config.num_experts_per_tok;
    std::vector<int32_t> out;
    const auto owned =
        static_cast<size_t>(std::count_if(impl_->slot_topk_ids.begin(), impl_->slot_topk_ids.end(),
                                          [](const int32_t* ids) { return ids != nullptr; }));
    out.resize(owned * static_cast<size_t>(per_slot));
    int32_t* slot_out = out.data();
    for (const int32_t* ids : impl_->slot_topk_ids) {
        if (ids == nullptr) continue;  // a MoE layer of another pipeline stage
        impl_->ops.copy_to_host(slot_out, ids, static_cast<size_t>(per_slot) * sizeof(int32_t));
        slot_out += per_slot;
    }
    return out;
}

void Model::sum_expert_load_over_ranks() {
    impl_->sum_loads();
}

void Model::update_router_bias(float gamma) {
    impl_->sum_loads();
    const int64_t E = impl_->config.n_routed_experts;
    // DeepSeek-V3 sec. 2.1.2: decrease the bias of overloaded experts by gamma, increase it for
    // underloaded ones (bias_update_speed); then count afresh.
    for (size_t slot = 0; slot < impl_->load_counts.size(); ++slot)
        if (impl_->slot_bias[slot] != nullptr)  // null: a MoE layer of another pipeline stage
            impl_->ops.router_bias_update(impl_->slot_bias[slot], impl_->load_counts[slot], E,
                                          gamma);
    if (!impl_->load_counts.empty()) impl_->loads.zero();
    impl_->load_summed = false;
}

ExpertLoadStats Model::expert_load() const {
    ExpertLoadStats stats;
    const auto E = static_cast<std::ptrdiff_t>(impl_->config.n_routed_experts);
    std::vector<int64_t> counts_all(impl_->load_host.size());
    impl_->ops.copy_to_host(counts_all.data(), impl_->loads.base(),
                            counts_all.size() * sizeof(int64_t));
    for (size_t slot = 0; slot < impl_->load_counts.size(); ++slot) {
        const auto first = counts_all.begin() + static_cast<std::ptrdiff_t>(slot) * E;
        stats.tokens_per_expert.emplace_back(first, first + E);
    }
    double worst_min = std::numeric_limits<double>::infinity();
    for (const std::vector<int64_t>& counts : stats.tokens_per_expert) {
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
Backend& Model::backend() const {
    return impl_->ops;
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

std::vector<parallel::ParamSpan> Model::param_spans() const {
    std::vector<parallel::ParamSpan> spans;
    spans.reserve(impl_->table.entries().size());
    for (size_t entry = 0; entry < impl_->table.entries().size(); ++entry) {
        const ParamEntry& e = impl_->table.entries()[entry];
        // Routed experts are replicated over the expert-data-parallel group (the whole
        // data-parallel group when ep = 1); everything else over the data-parallel group.
        const bool expert = is_routed_expert_param(e.name);
        const auto group = expert ? parallel::ReplicaGroup::expert_data_parallel
                                  : parallel::ReplicaGroup::data_parallel;
        // A parameter the TP ranks replicate (not split) has the same copy on each of them; the
        // routed experts' EDP group already counts every rank.
        int copies = expert || e.tp.sharded() ? 1 : impl_->tp.size();
        if (expert && !impl_->placements.empty()) {
            // Redundant experts: a slot is one of its expert's replicas, which hold the same
            // gradient (arm_replica_gradient_sum), so the global norm counts each once.
            const ExpertShard& shard = impl_->shard;
            const int64_t per_slot = e.numel / shard.count;
            const parallel::ExpertPlacement& placement =
                impl_->placements[static_cast<size_t>(impl_->entry_moe_layer[entry])];
            for (int64_t i = 0; i < shard.count; ++i) {
                const int32_t x = placement.slot_expert[static_cast<size_t>(shard.first + i)];
                spans.push_back({e.offset + i * per_slot, per_slot, group, e.trainable,
                                 e.weight_decay, static_cast<int>(placement.replicas(x)),
                                 /*own_run=*/true});
            }
            continue;
        }
        // The embedding's copy on the MTP stage counts once in the gradient norm over both.
        if (e.name == "embed" && impl_->shares_embedding()) copies *= 2;
        spans.push_back({e.offset, e.numel, group, e.trainable, e.weight_decay, copies});
    }
    return spans;
}

ExpertShard Model::expert_shard() const {
    return impl_->shard;
}

const parallel::ExpertPlacement* Model::expert_placement(int64_t moe_layer) const {
    if (impl_->placements.empty()) return nullptr;
    MT_CHECK(moe_layer >= 0 && moe_layer < static_cast<int64_t>(impl_->placements.size()),
             "[model] MoE layer {} of {}", moe_layer, impl_->placements.size());
    return &impl_->placements[static_cast<size_t>(moe_layer)];
}

int64_t Model::moe_layer_of(const std::string& param_name) const {
    if (impl_->entry_moe_layer.empty()) return -1;
    const ParamEntry& e = impl_->table.entry(param_name);
    const auto& entries = impl_->table.entries();
    return impl_->entry_moe_layer[static_cast<size_t>(&e - entries.data())];
}

void Model::set_expert_placement(int64_t moe_layer, const parallel::ExpertPlacement& placement) {
    const parallel::ExpertPlacement* now = expert_placement(moe_layer);
    MT_CHECK(now != nullptr && placement.slot_expert.size() == now->slot_expert.size(),
             "[model] a new expert placement needs redundant experts and the same slots");
    parallel::ExpertPlacement& p = impl_->placements[static_cast<size_t>(moe_layer)];
    p.slot_expert = placement.slot_expert;  // same sizes: no allocation
    p.replica_first = placement.replica_first;
    p.replica_slots = placement.replica_slots;
    p.slot_share = placement.slot_share;
}

void Model::take_expert_rows(std::span<int64_t> rows_per_moe_layer) {
    MT_CHECK(rows_per_moe_layer.size() == impl_->expert_rows.size(),
             "[model] {} MoE layers' rows asked, the model has {}", rows_per_moe_layer.size(),
             impl_->expert_rows.size());
    std::copy(impl_->expert_rows.begin(), impl_->expert_rows.end(), rows_per_moe_layer.begin());
    std::fill(impl_->expert_rows.begin(), impl_->expert_rows.end(), 0);
}

int64_t Model::num_moe_layers() const {
    return static_cast<int64_t>(impl_->expert_rows.size());
}

void Model::set_expert_shares(int64_t moe_layer, std::span<const int32_t> slot_share) {
    const parallel::ExpertPlacement* now = expert_placement(moe_layer);
    MT_CHECK(now != nullptr && slot_share.size() == now->slot_share.size(),
             "[model] new replica shares need redundant experts and the same slots");
    parallel::ExpertPlacement& p = impl_->placements[static_cast<size_t>(moe_layer)];
    std::copy(slot_share.begin(), slot_share.end(), p.slot_share.begin());
}

double Model::take_expert_compute_s() {
    const double s = impl_->expert_compute_s;
    impl_->expert_compute_s = 0;
    return s;
}

void Model::arm_replica_gradient_sum() {
    impl_->replica_sum_armed = !impl_->placements.empty();
}

TensorView Model::param(const std::string& name) const {
    const ParamEntry& e = impl_->table.entry(name);
    return {static_cast<float*>(impl_->params.base()) + e.offset, e.shape, DType::f32};
}

TensorView Model::grad(const std::string& name) const {
    const ParamEntry& e = impl_->table.entry(name);
    return {static_cast<float*>(impl_->grads.base()) + e.offset, e.shape, DType::f32};
}

parallel::ExpertDispatcher* Model::expert_dispatcher() const {
    return impl_->dispatcher.get();
}

size_t Model::planned_bytes() const {
    const size_t dispatch = impl_->dispatcher ? impl_->dispatcher->buffer_bytes() : 0;
    return impl_->params.size_bytes() + impl_->grads.size_bytes() + impl_->acts.size_bytes() +
           dispatch;
}

RankMemoryPlan plan_rank_memory(const ModelConfig& c, const ModelRuntime& runtime,
                                const parallel::Topology& layout, const MoeSettings& moe,
                                bool zero1) {
    MT_CHECK(layout.tp >= 1 && layout.ep >= 1 && layout.dp >= 1 && layout.edp >= 1,
             "[model] plan_rank_memory: bad layout tp {} ep {} dp {} edp {}", layout.tp, layout.ep,
             layout.dp, layout.edp);
    RankMemoryPlan plan;
    // Parameters: counted part by part, as the cluster model counts them; the table of rank 0
    // (what a Model allocates; every rank holds as many) must hold exactly that.
    const RankParamCount count = rank_param_count(c, layout.tp, layout.ep);
    const ParamTable table(sharded_param_specs(c, first_expert_shard(c, layout.ep), 0, layout.tp,
                                               {whole_model_chunk(c)}));
    MT_CHECK(table.total_numel() == count.total(),
             "[model] the parameter table holds {} floats, its parts count {}", table.total_numel(),
             count.total());
    const int64_t dense_floats = count.dense - count.untrained, expert_floats = count.expert;
    plan.parameters = static_cast<size_t>(count.total()) * sizeof(float);
    plan.gradients = plan.parameters;
    // AdamW's two moments; ZeRO-1 shards them over DP (routed experts: over EDP).
    const int64_t moment_floats = zero1 ? dense_floats / layout.dp + expert_floats / layout.edp
                                        : dense_floats + expert_floats;
    plan.optimizer_state = static_cast<size_t>(2 * moment_floats) * sizeof(float);

    // The expert side: the rows the dispatcher plans, then the activation arena's plan.
    if (c.n_routed_experts > 0) {
        parallel::ExpertDispatchConfig dc = expert_dispatch_config(
            c, runtime.batch_size * runtime.seq_len, moe, layout.ep_ranks_per_domain());
        plan.expert_rows = parallel::planned_expert_rows(dc, layout.ep);
        dc.capacity_factor = 0;
        plan.worst_case_expert_rows = parallel::planned_expert_rows(dc, layout.ep);
        dc.capacity_factor = moe.capacity_factor;
        plan.communication = parallel::planned_buffer_bytes(dc, layout.ep);
    }
    ArenaPlan acts("activations");
    ActivationSet set;
    bind_model_activations(BufferBinder(acts), set, c, runtime, layout.tp, plan.expert_rows,
                           {whole_model_chunk(c)});
    for (const ArenaEntry& e : acts.entries())
        if (is_expert_side_buffer(e.name)) plan.expert_side += e.size_bytes;
    plan.activations = acts.total_bytes() - plan.expert_side;
    return plan;
}

}  // namespace moetron
