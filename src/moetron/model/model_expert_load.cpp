// What the routed experts of a Model were given: the tokens routed to each expert (per MoE layer,
// counted in forward_backward), their sum over the ranks and the router bias update they drive
// (DeepSeek-V3's auxiliary-loss-free balancing); the last routing; the expert-side rows and the
// compute time since the last look.
#include "moetron/model/model_impl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "moetron/parallel/communicator.h"

namespace moetron {

// One row of E counts per slot, zeroed (arenas are allocated zero-filled).
void Model::Impl::plan_expert_loads() {
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

void Model::Impl::sum_loads() {
    if (load_summed) return;
    load_summed = true;
    if (parallel.load == nullptr || parallel.load->size() == 1) return;
    ops.copy_to_host(load_host.data(), loads.base(), load_host.size() * sizeof(int64_t));
    for (size_t i = 0; i < load_host.size(); ++i) load_sum[i] = static_cast<double>(load_host[i]);
    // Counts are far below 2^53, so the sum in doubles is exact.
    parallel.load->all_reduce_sum(load_sum.data(), load_sum.size(), DType::f64, kHostStream);
    for (size_t i = 0; i < load_host.size(); ++i) load_host[i] = static_cast<int64_t>(load_sum[i]);
    ops.copy_from_host(loads.base(), load_host.data(), load_host.size() * sizeof(int64_t));
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

double Model::take_expert_compute_s() {
    const double s = impl_->expert_compute_s;
    impl_->expert_compute_s = 0;
    return s;
}

}  // namespace moetron
