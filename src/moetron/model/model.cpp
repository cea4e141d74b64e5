// The whole model: embedding -> blocks -> final norm -> head -> cross-entropy, the MTP modules on
// the last hidden state, and the backward through all of it (DESIGN.md sec. 2).
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
//
// This file builds the model (its checks, its arenas) and holds the plain accessors; the files of
// its other parts are listed in model_impl.h.
#include "moetron/model/model.h"

#include <string>
#include <vector>

#include "moetron/core/checked_math.h"
#include "moetron/kernels/backend.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/model_impl.h"
#include "moetron/parallel/communicator.h"

namespace moetron {

namespace {

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

void check_model_config(const ModelConfig& c, const ModelRuntime& r) {
    require_engine_recipe(r.precision);
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

Model::Impl::Impl(const ModelConfig& c, const ModelRuntime& r, const LossWeights& lw,
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

    if (c.n_routed_experts > 0) build_expert_dispatcher();

    sets.resize(set_chunk.size());
    contexts.resize(sets.size());
    ArenaPlan act_plan("activations");
    bind_activations(BufferBinder(act_plan));
    acts = Arena(act_plan, ops.memory());
    bind_activations(BufferBinder(acts));
    ops.rope_tables(sets[0].rope_cos, sets[0].rope_sin, r.seq_len, c.qk_rope_head_dim,
                    static_cast<float>(c.rope_theta));
    rope = {sets[0].rope_cos, sets[0].rope_sin};

    number_moe_slots();
    plan_expert_loads();
    plan_grad_ranges();
}

void Model::Impl::bind_activations(const BufferBinder& b) {
    const int64_t expert_rows = dispatcher ? dispatcher->capacity_rows() : 0;
    for (size_t k = 0; k < sets.size(); ++k)
        bind_model_activations(b, sets[k], config, runtime, tp.size(), expert_rows,
                               {chunks[set_chunk[k]]},
                               k == 0 ? std::string() : fmt::format("set{}.", k));
}

// Memory that cannot possibly fit is refused before the first allocation, with its size: the
// parameters, their gradients and the residual stream (a lower bound of the activations; the
// exact activation arena is planned later and checked again when allocated).
void Model::Impl::check_fits_before_allocating(const ArenaPlan& param_plan) const {
    const int64_t rows =
        checked_product({runtime.batch_size, runtime.seq_len}, "[model] tokens per micro-batch") /
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

Model::Model(const ModelConfig& config, const ModelRuntime& runtime, const LossWeights& weights,
             const ModelParallel& parallel) {
    check_model_config(config, runtime);
    check_groups_fit_model(config, runtime, parallel);
    impl_ = std::make_unique<Impl>(config, runtime, weights, parallel);
}

Model::~Model() = default;

void Model::zero_grads() {
    impl_->grads.zero();
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

TensorView Model::param(const std::string& name) const {
    const ParamEntry& e = impl_->table.entry(name);
    return {static_cast<float*>(impl_->params.base()) + e.offset, e.shape, DType::f32};
}

TensorView Model::grad(const std::string& name) const {
    const ParamEntry& e = impl_->table.entry(name);
    return {static_cast<float*>(impl_->grads.base()) + e.offset, e.shape, DType::f32};
}

size_t Model::planned_bytes() const {
    const size_t dispatch = impl_->dispatcher ? impl_->dispatcher->buffer_bytes() : 0;
    return impl_->params.size_bytes() + impl_->grads.size_bytes() + impl_->acts.size_bytes() +
           dispatch;
}

}  // namespace moetron
