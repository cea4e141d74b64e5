// What a Model's arenas hold: the tree of parameter pointers and its binding (in the parameter
// table's order), the activation sets, the parameter counts by part (params.h's model_param_specs
// and rank_param_count) and the memory a rank plans (model.h's plan_rank_memory), all from the
// same binders, so that a plan and the arenas a Model allocates cannot disagree.
#include "moetron/model/model_impl.h"

#include <limits>
#include <string>
#include <vector>

#include "moetron/parallel/topology.h"

namespace moetron {

namespace {

// Vocabulary-parallel over TP (vocab_parallel.h): each rank holds V/tp rows of the embedding and
// of the head.
void bind_embedding_params(ParamBinder& b, ModelParams& p, const ModelConfig& c) {
    b.column_parallel_weight(p.embed, "embed", {c.vocab_size, c.hidden_size});
}
void bind_output_params(ParamBinder& b, ModelParams& p, const ModelConfig& c) {
    b.norm(p.final_norm, "final_norm", c.hidden_size);
    b.column_parallel_weight(p.head, "head", {c.vocab_size, c.hidden_size});
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

}  // namespace

ModelParams sharded_tree(const ModelConfig& c, const ExpertShard& shard) {
    ModelParams p;
    p.layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (BlockParams& layer : p.layers) layer.moe.experts = shard;
    p.mtp.resize(static_cast<size_t>(c.num_nextn_predict_layers));
    for (MtpParams& m : p.mtp) m.block.moe.experts = shard;
    return p;
}

PipelineChunk whole_model_chunk(const ModelConfig& c) {
    return {.embedding = true,
            .first_layer = 0,
            .num_layers = c.num_hidden_layers,
            .first_mtp = 0,
            .num_mtp = c.num_nextn_predict_layers,
            .loss = true};
}

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

void bind_model_activations(BufferBinder b, ActivationSet& a, const ModelConfig& c,
                            const ModelRuntime& runtime, int tp_size, int64_t expert_rows,
                            const std::vector<PipelineChunk>& chunks, const std::string& prefix) {
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

RankMemoryPlan plan_rank_memory(const ModelConfig& c, const ModelRuntime& runtime,
                                const parallel::Topology& layout, const MoeSettings& moe,
                                bool zero1) {
    MT_CHECK(layout.tp >= 1 && layout.ep >= 1 && layout.dp >= 1 && layout.edp >= 1,
             "[model] plan_rank_memory: bad layout tp {} ep {} dp {} edp {}", layout.tp, layout.ep,
             layout.dp, layout.edp);
    RankMemoryPlan plan;
    // Parameters: counted part by part, as the cluster model counts them; the table of rank 0
    // (what a Model allocates; every rank holds as many) must hold exactly that.
    RankParamCount count = rank_param_count(c, layout.tp, layout.ep);
    ExpertShard shard = first_expert_shard(c, layout.ep);
    // Redundant experts: (E + R) / ep slots per rank, each one expert's tensors.
    const int64_t slots = physical_expert_slots(c, moe);
    if (c.n_routed_experts > 0 && slots != c.n_routed_experts) {
        MT_CHECK(slots % layout.ep == 0, "[model] {} expert slots do not split over ep {}", slots,
                 layout.ep);
        const int64_t experts_here = c.n_routed_experts / layout.ep;
        count.expert = count.expert / experts_here * (slots / layout.ep);
        shard = {0, slots / layout.ep, slots};
    }
    const ParamTable table(sharded_param_specs(c, shard, 0, layout.tp, {whole_model_chunk(c)}));
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
