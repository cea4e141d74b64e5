// Counter-based initialization of a Model's parameters: every element from (seed, its tensor's
// name, its index in the whole model), so that a rank's shard of the experts, or a redundant
// expert's slot, starts as the same expert of the unsharded model.
#include "moetron/model/model_impl.h"

#include "moetron/core/rng.h"

namespace moetron {

void Model::init_parameters(uint64_t seed) {
    impl_->table.initialize(impl_->ops, params(), seed);
    impl_->init_expert_shard(seed);
}

void Model::Impl::init_expert_shard(uint64_t seed) {
    if (!placements.empty()) return init_expert_slots(seed);
    if (shard.first == 0) return;  // the first shard's global indices are its local ones
    for (size_t i = 0; i < table.specs().size(); ++i) {
        const TensorSpec& spec = table.specs()[i];
        if (!is_routed_expert_param(spec.name)) continue;
        const ParamEntry& e = table.entries()[i];
        const int64_t per_expert = e.numel / shard.count;
        ops.init_normal(static_cast<float*>(params.base()) + e.offset, seed, fnv1a_64(spec.name), 1,
                        e.numel, shard.first * per_expert, 0, spec.init_stddev);
    }
}

// Redundant experts: each local slot gets the numbers of the logical expert it holds, so
// that replicas start identical and equal to that expert in a run without them.
void Model::Impl::init_expert_slots(uint64_t seed) {
    for (size_t i = 0; i < table.specs().size(); ++i) {
        const TensorSpec& spec = table.specs()[i];
        if (!is_routed_expert_param(spec.name)) continue;
        const ParamEntry& e = table.entries()[i];
        const int64_t per_expert = e.numel / shard.count;
        const parallel::ExpertPlacement& placement =
            placements[static_cast<size_t>(entry_moe_layer[i])];
        for (int64_t local = 0; local < shard.count; ++local) {
            const int64_t expert = placement.slot_expert[static_cast<size_t>(shard.first + local)];
            ops.init_normal(static_cast<float*>(params.base()) + e.offset + local * per_expert,
                            seed, fnv1a_64(spec.name), 1, per_expert, expert * per_expert, 0,
                            spec.init_stddev);
        }
    }
}

}  // namespace moetron
