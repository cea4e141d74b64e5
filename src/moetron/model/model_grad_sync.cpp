// What gradient synchronization sees of a Model: the parameter groups announced to the
// GradReadyCallback as their gradients become final (in backward order, model_passes.cpp), and
// the flat buffer's spans with their replica groups (param_spans).
#include "moetron/model/model_impl.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace moetron {

namespace {

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

void Model::Impl::plan_grad_ranges() {
    const ModelConfig& c = config;
    int64_t covered = 0;
    auto add = [&covered](FloatRange r) {
        covered += r.end - r.begin;
        return r;
    };
    head_range = add(entries_range(table, "the head and final norm", [](const std::string& n) {
        return n == "final_norm" || n == "head";
    }));
    embed_range = add(
        entries_range(table, "the embedding", [](const std::string& n) { return n == "embed"; }));
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

void Model::Impl::notify_grads_ready(const FloatRange& r) const {
    if (grad_ready && r.end > r.begin) grad_ready(r.begin, r.end);
}

void Model::set_grad_ready_callback(GradReadyCallback callback) {
    impl_->grad_ready = std::move(callback);
}

const GradReadyCallback& Model::grad_ready_callback() const {
    return impl_->grad_ready;
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

}  // namespace moetron
