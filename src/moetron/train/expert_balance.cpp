#include "moetron/train/expert_balance.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace {

// Weight of the older average in each step's update: about the last 10 steps count.
constexpr double kAverageDecay = 0.9;

// The slot that feeds new slot `slot` of `to`: a replica of its expert already on the destination
// rank (copied there), else one of the old replicas, spread by the slot index.
int64_t source_slot(const parallel::ExpertPlacement& from, const parallel::ExpertPlacement& to,
                    int64_t slot) {
    const int32_t expert = to.slot_expert[static_cast<size_t>(slot)];
    const auto slots = from.slots_of(expert);
    for (int32_t s : slots)
        if (from.rank_of_slot(s) == to.rank_of_slot(slot)) return s;
    return slots[static_cast<size_t>(slot) % slots.size()];
}

// Copies numel floats starting at flat offset `offset` between the moment ranges and `buffer`.
template <class Copy>
void for_moments(const std::vector<AdamW::MomentRange>& ranges, int64_t offset, int64_t numel,
                 Copy copy) {
    int64_t done = 0;
    for (const AdamW::MomentRange& r : ranges) {
        const int64_t lo = std::max(offset, r.offset);
        const int64_t hi = std::min(offset + numel, r.offset + r.numel);
        if (lo >= hi) continue;
        copy(r.m + (lo - r.offset), r.v + (lo - r.offset), lo - offset, hi - lo);
        done += hi - lo;
    }
    MT_CHECK(done == numel, "[expert_balance] the moments cover {} of the {} floats of a slot",
             done, numel);
}

}  // namespace

ExpertBalancer::ExpertBalancer(Model& model, AdamW& optimizer, parallel::Communicator& ep,
                               int64_t ep_ranks_per_domain, int64_t rebalance_every)
    : model_(model), optimizer_(optimizer), ep_(ep), rebalance_every_(rebalance_every) {
    const ModelConfig& c = model.config();
    const int64_t E = c.n_routed_experts;
    parallel::PlacementShape contiguous{E, E, ep.size(),
                                        ep.size() / std::max<int64_t>(1, ep_ranks_per_domain), 1};
    contiguous_ = parallel::initial_placement(contiguous);
    compute_of_rank_.resize(static_cast<size_t>(ep.size()));
    const parallel::ExpertPlacement* placement = model.expert_placement(0);
    MT_USER_CHECK(rebalance_every == 0 || placement != nullptr,
                  "--rebalance-every {} moves redundant expert slots: give --redundant-experts R "
                  "(e.g. R = ep, one spare slot per rank)",
                  rebalance_every);
    if (placement != nullptr)
        for (const ParamEntry& e : model.param_entries())
            num_moe_layers_ = std::max(num_moe_layers_, model.moe_layer_of(e.name) + 1);
    if (rebalance_every == 0) return;

    const std::vector<AdamW::MomentRange> ranges = optimizer.moment_ranges();
    const int64_t slots = placement->shape.slots_per_rank();
    int64_t layers = 0;
    for (const ParamEntry& e : model.param_entries()) {
        const int64_t layer = model.moe_layer_of(e.name);
        if (layer < 0) continue;
        SlotTensor t;
        t.moe_layer = layer;
        t.param = model.params() + e.offset;
        t.offset = e.offset;
        t.per_slot = e.numel / slots;
        for (const AdamW::MomentRange& r : ranges)
            if (r.offset < e.offset + e.numel && r.offset + r.numel > e.offset)
                t.moments.push_back(r);
        std::sort(t.moments.begin(), t.moments.end(),
                  [](const auto& a, const auto& b) { return a.offset < b.offset; });
        int64_t covered = 0;
        for (const AdamW::MomentRange& r : t.moments)
            covered +=
                std::min(r.offset + r.numel, e.offset + e.numel) - std::max(r.offset, e.offset);
        MT_USER_CHECK(covered == e.numel,
                      "--rebalance-every needs each rank to hold the whole optimizer state of its "
                      "expert slots, but the experts' ZeRO-1 shards split it over an "
                      "expert-data-parallel group: use --no-zero1, or a layout whose ep covers "
                      "the expert ranks (edp 1)");
        if (layer == 0) slot_floats_ += 3 * t.per_slot;  // every layer's experts are alike
        layers = std::max(layers, layer + 1);
        tensors_.push_back(std::move(t));
    }
    average_.assign(static_cast<size_t>(layers), std::vector<double>(static_cast<size_t>(E), 0.0));
    // A rank receives at most its own slots, but may be the source of every other rank's.
    const auto buffer = static_cast<size_t>(slots * slot_floats_);
    staging_.resize(buffer);
    send_.resize(buffer * static_cast<size_t>(std::max(1, ep.size() - 1)));
    recv_.resize(buffer);
    const auto n = static_cast<size_t>(ep.size());
    send_counts_.resize(n);
    send_displs_.resize(n);
    recv_counts_.resize(n);
    recv_displs_.resize(n);
    next_from_.resize(n);
}

BalanceRecord ExpertBalancer::after_step(int64_t step, const ExpertLoadStats& load,
                                         double expert_compute_s) {
    BalanceRecord r;
    ep_.all_gather(compute_of_rank_.data(), &expert_compute_s, 1, DType::f64, kHostStream);
    for (double s : compute_of_rank_) {
        r.expert_compute_max_s = std::max(r.expert_compute_max_s, s);
        r.expert_compute_mean_s += s / static_cast<double>(compute_of_rank_.size());
    }
    for (size_t l = 0; l < load.tokens_per_expert.size(); ++l) {
        const std::vector<int64_t>& counts = load.tokens_per_expert[l];
        const std::vector<double> layer_load(counts.begin(), counts.end());
        const parallel::ExpertPlacement* placement =
            model_.expert_placement(static_cast<int64_t>(l));
        const parallel::ExpertPlacement& serving = placement != nullptr ? *placement : contiguous_;
        r.rank_load_max_over_mean =
            std::max(r.rank_load_max_over_mean, parallel::rank_imbalance(serving, layer_load));
        if (l >= average_.size()) continue;  // no rebalancing
        std::vector<double>& average = average_[l];
        for (size_t e = 0; e < average.size(); ++e)
            average[e] = has_average_
                             ? kAverageDecay * average[e] + (1 - kAverageDecay) * layer_load[e]
                             : layer_load[e];
    }
    has_average_ = true;
    if (rebalance_every_ == 0 || step % rebalance_every_ != 0) return r;

    r.rebalanced = true;
    Timer timer;
    for (size_t l = 0; l < average_.size(); ++l) {
        const auto layer = static_cast<int64_t>(l);
        const parallel::ExpertPlacement& now = *model_.expert_placement(layer);
        const parallel::ExpertPlacement next = parallel::balanced_placement(average_[l], now.shape);
        r.average_max_over_mean_before =
            std::max(r.average_max_over_mean_before, parallel::rank_imbalance(now, average_[l]));
        r.average_max_over_mean_after =
            std::max(r.average_max_over_mean_after, parallel::rank_imbalance(next, average_[l]));
        r.average_expert_load.resize(average_[l].size());
        for (size_t e = 0; e < average_[l].size(); ++e) r.average_expert_load[e] += average_[l][e];
        if (next == now) continue;
        for (size_t s = 0; s < next.slot_expert.size(); ++s)
            r.migrated_slots += next.slot_expert[s] != now.slot_expert[s];
        migrate(layer, now, next);
        model_.set_expert_placement(layer, next);
        // The replicas a slot has are its copies in the gradient norm.
        const int64_t first = ep_.rank() * next.shape.slots_per_rank();
        for (const SlotTensor& t : tensors_) {
            if (t.moe_layer != layer) continue;
            for (int64_t i = 0; i < next.shape.slots_per_rank(); ++i)
                optimizer_.set_copies_outside_group(
                    t.offset + i * t.per_slot, t.per_slot,
                    static_cast<int>(
                        next.replicas(next.slot_expert[static_cast<size_t>(first + i)])));
        }
    }
    r.migration_s = timer.elapsed_s();
    return r;
}

std::vector<std::vector<int32_t>> ExpertBalancer::slot_tables() const {
    std::vector<std::vector<int32_t>> tables;
    for (int64_t l = 0; model_.expert_placement(0) != nullptr && l < num_moe_layers_; ++l)
        tables.push_back(model_.expert_placement(l)->slot_expert);
    return tables;
}

bool ExpertBalancer::restore(const std::vector<std::vector<int32_t>>& slot_tables,
                             const std::vector<std::vector<double>>& averages) {
    if (averages.size() == average_.size()) {
        average_ = averages;
        has_average_ = !average_.empty();
    }
    const parallel::ExpertPlacement* first = model_.expert_placement(0);
    if (first == nullptr || static_cast<int64_t>(slot_tables.size()) != num_moe_layers_)
        return false;
    for (const std::vector<int32_t>& t : slot_tables)
        if (static_cast<int64_t>(t.size()) != first->shape.num_slots) return false;
    for (int64_t l = 0; l < num_moe_layers_; ++l) {
        const parallel::ExpertPlacement p =
            parallel::placement_from_slots(first->shape, slot_tables[static_cast<size_t>(l)]);
        model_.set_expert_placement(l, p);
    }
    // The replicas a slot has are its copies in the gradient norm.
    const int64_t slots = first->shape.slots_per_rank(), first_slot = ep_.rank() * slots;
    for (const ParamEntry& e : model_.param_entries()) {
        const int64_t layer = model_.moe_layer_of(e.name);
        if (layer < 0) continue;
        const parallel::ExpertPlacement& p = *model_.expert_placement(layer);
        const int64_t per_slot = e.numel / slots;
        for (int64_t i = 0; i < slots; ++i)
            optimizer_.set_copies_outside_group(
                e.offset + i * per_slot, per_slot,
                static_cast<int>(p.replicas(p.slot_expert[static_cast<size_t>(first_slot + i)])));
    }
    return true;
}

void ExpertBalancer::pack_slot(int64_t moe_layer, int64_t local_slot, float* out) const {
    for (const SlotTensor& t : tensors_) {
        if (t.moe_layer != moe_layer) continue;
        const int64_t at = local_slot * t.per_slot;
        std::copy(t.param + at, t.param + at + t.per_slot, out);
        for_moments(t.moments, t.offset + at, t.per_slot,
                    [&](const float* m, const float* v, int64_t i, int64_t n) {
                        std::copy(m, m + n, out + t.per_slot + i);
                        std::copy(v, v + n, out + 2 * t.per_slot + i);
                    });
        out += 3 * t.per_slot;
    }
}

void ExpertBalancer::unpack_slot(int64_t moe_layer, int64_t local_slot, const float* in) {
    for (const SlotTensor& t : tensors_) {
        if (t.moe_layer != moe_layer) continue;
        const int64_t at = local_slot * t.per_slot;
        std::copy(in, in + t.per_slot, t.param + at);
        for_moments(t.moments, t.offset + at, t.per_slot,
                    [&](float* m, float* v, int64_t i, int64_t n) {
                        std::copy(in + t.per_slot + i, in + t.per_slot + i + n, m);
                        std::copy(in + 2 * t.per_slot + i, in + 2 * t.per_slot + i + n, v);
                    });
        in += 3 * t.per_slot;
    }
}

void ExpertBalancer::migrate(int64_t moe_layer, const parallel::ExpertPlacement& from,
                             const parallel::ExpertPlacement& to) {
    const int64_t S = to.shape.slots_per_rank(), me = ep_.rank(), ranks = ep_.size();
    for (int64_t i = 0; i < S; ++i) pack_slot(moe_layer, i, staging_.data() + i * slot_floats_);
    auto staged = [&](int64_t slot) { return staging_.data() + (slot - me * S) * slot_floats_; };
    // Sends in (destination, new slot) order; receives in (source rank, new slot) order.
    int64_t sent = 0, received = 0;
    for (int64_t b = 0; b < ranks; ++b) {
        send_displs_[static_cast<size_t>(b)] = static_cast<int>(sent * slot_floats_);
        recv_displs_[static_cast<size_t>(b)] = static_cast<int>(received * slot_floats_);
        int64_t to_b = 0, from_b = 0;
        if (b != me) {
            for (int64_t slot = b * S; slot < (b + 1) * S; ++slot) {
                const int64_t src = source_slot(from, to, slot);
                if (from.rank_of_slot(src) != me) continue;
                MT_CHECK((sent + to_b + 1) * slot_floats_ <= static_cast<int64_t>(send_.size()),
                         "[expert_balance] the migration sends more slots than planned");
                std::copy(staged(src), staged(src) + slot_floats_,
                          send_.data() + (sent + to_b) * slot_floats_);
                ++to_b;
            }
            for (int64_t slot = me * S; slot < (me + 1) * S; ++slot)
                from_b += from.rank_of_slot(source_slot(from, to, slot)) == b;
        }
        send_counts_[static_cast<size_t>(b)] = static_cast<int>(to_b * slot_floats_);
        recv_counts_[static_cast<size_t>(b)] = static_cast<int>(from_b * slot_floats_);
        sent += to_b;
        received += from_b;
    }
    ep_.all_to_all_v(recv_.data(), recv_counts_, recv_displs_, send_.data(), send_counts_,
                     send_displs_, DType::f32, kHostStream);
    std::fill(next_from_.begin(), next_from_.end(), 0);
    for (int64_t slot = me * S; slot < (me + 1) * S; ++slot) {
        const int64_t src = source_slot(from, to, slot);
        const auto a = static_cast<size_t>(from.rank_of_slot(src));
        const float* in = static_cast<int64_t>(a) == me
                              ? staged(src)
                              : recv_.data() + recv_displs_[a] + next_from_[a]++ * slot_floats_;
        unpack_slot(moe_layer, slot - me * S, in);
    }
}

}  // namespace moetron
