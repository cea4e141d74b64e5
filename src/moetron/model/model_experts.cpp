// The routed experts of a Model: which of them this rank holds (its ExpertShard; with redundant
// experts, physical slots and the logical expert each holds), the ExpertDispatcher that moves the
// token copies over the EP group with one dispatcher slot per MoE layer and activation set, and
// the redundant experts' plumbing (the replicas' gradient sum, the placements the trainer
// installs).
#include "moetron/model/model_impl.h"

#include <algorithm>
#include <string>

#include "moetron/core/user_error.h"
#include "moetron/parallel/communicator.h"

namespace moetron {

int64_t physical_expert_slots(const ModelConfig& c, const MoeSettings& moe) {
    return c.n_routed_experts + moe.redundant_experts;
}

namespace {

// The shape of the redundant experts' placement over the EP group: its domains, and the router's
// groups that hierarchical placement keeps inside them.
parallel::PlacementShape placement_shape(const ModelConfig& c, const ModelParallel& parallel,
                                         int64_t ep_ranks_per_domain) {
    parallel::PlacementShape s;
    s.num_experts = c.n_routed_experts;
    s.num_slots = physical_expert_slots(c, parallel.moe);
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

int64_t num_moe_slots(const ModelConfig& c) {
    int64_t slots = c.num_moe_layers();
    for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d) slots += c.mtp_layer_is_moe(d);
    return slots;
}

}  // namespace

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
            {c.n_routed_experts, physical_expert_slots(c, parallel.moe), parallel.ep->size()});
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
        const int64_t slots = physical_expert_slots(c, parallel.moe);
        const int64_t local = slots / ep;
        return {parallel.ep->rank() * local, local, slots};
    }
    const int64_t local = c.n_routed_experts / ep;
    return {parallel.ep->rank() * local, local};
}

parallel::ExpertDispatchConfig expert_dispatch_config(const ModelConfig& c, int64_t max_tokens,
                                                      const MoeSettings& moe,
                                                      int64_t ep_ranks_per_domain) {
    parallel::ExpertDispatchConfig dc;
    dc.routing.num_experts = physical_expert_slots(c, moe);
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

// The MoE layers' dispatcher, and with redundant experts the placements it routes by.
void Model::Impl::build_expert_dispatcher() {
    const ModelConfig& c = config;
    const ModelRuntime& r = runtime;
    const ModelParallel& par = parallel;
    parallel::ExpertDispatchConfig dc =
        expert_dispatch_config(c, r.batch_size * r.seq_len, par.moe, ep_ranks_per_domain(par));
    // Each micro-batch in flight keeps its own routings until its backward.
    dc.num_slots *= static_cast<int64_t>(set_chunk.size());
    check_domain_limited_routing(c, dc, par);
    if (par.moe.redundant_experts > 0) {
        const parallel::PlacementShape shape = placement_shape(c, par, ep_ranks_per_domain(par));
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

// Numbers a MoE block of the whole model; when this rank runs it (bp not null), points each
// activation set's block at its own dispatcher slots.
template <class BlockOf>
int64_t Model::Impl::add_slot(bool is_moe, const BlockParams* bp, BlockOf block_of) {
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

// The MoE blocks of the whole model, main layers then MTP blocks, numbered as slots.
void Model::Impl::number_moe_slots() {
    const ModelConfig& c = config;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        main_slot.push_back(add_slot(c.is_moe_layer(l), owns_layer(l) ? &w.layers[l] : nullptr,
                                     [l](ActivationSet& a) { return &a.layers[l]; }));
    for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d)
        mtp_slot.push_back(add_slot(c.mtp_layer_is_moe(d) && c.n_routed_experts > 0,
                                    owns_mtp(d) ? &w.mtp[d].block : nullptr,
                                    [d](ActivationSet& a) { return &a.mtp[d].block; }));
}

// The routed experts' entries come two per MoE layer (gate_up, down), in the layers' order:
// main layers, then MTP blocks (bind_model_params), as the load slots.
void Model::Impl::map_expert_entries_to_layers() {
    entry_moe_layer.assign(table.entries().size(), -1);
    int64_t k = 0;
    for (size_t i = 0; i < table.entries().size(); ++i)
        if (is_routed_expert_param(table.entries()[i].name)) entry_moe_layer[i] = k++ / 2;
    MT_CHECK(k == 2 * static_cast<int64_t>(placements.size()),
             "[model] {} routed expert tensors for {} MoE layers", k, placements.size());
}

// After a MoE block's backward on the armed (last) micro-batch: its replicas' gradients
// summed over the EP group (a collective over it; every rank runs the same blocks).
void Model::Impl::sum_replica_grads(const BlockParams& grads, int64_t moe_layer) {
    if (!replica_sum_armed || !grads.is_moe) return;
    const int64_t F = config.moe_intermediate_size, D = config.hidden_size;
    const parallel::SlotTensor tensors[] = {{grads.moe.experts_gate_up, 2 * F * D},
                                            {grads.moe.experts_down, D * F}};
    replica_grads->sum(placements[static_cast<size_t>(moe_layer)], tensors, *parallel.ep);
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

void Model::set_expert_shares(int64_t moe_layer, std::span<const int32_t> slot_share) {
    const parallel::ExpertPlacement* now = expert_placement(moe_layer);
    MT_CHECK(now != nullptr && slot_share.size() == now->slot_share.size(),
             "[model] new replica shares need redundant experts and the same slots");
    parallel::ExpertPlacement& p = impl_->placements[static_cast<size_t>(moe_layer)];
    std::copy(slot_share.begin(), slot_share.end(), p.slot_share.begin());
}

void Model::arm_replica_gradient_sum() {
    impl_->replica_sum_armed = !impl_->placements.empty();
}

parallel::ExpertDispatcher* Model::expert_dispatcher() const {
    return impl_->dispatcher.get();
}

}  // namespace moetron
