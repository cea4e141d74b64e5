#include "moetron/train/expert_balance.h"

#include <algorithm>
#include <bit>
#include <span>

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

// Calls copy(m, v, i, n) for each piece of the numel floats at flat offset `offset` that the
// moment ranges hold (i: the piece's first float, from offset); returns the floats covered.
template <class Copy>
int64_t for_moments(const std::vector<AdamW::MomentRange>& ranges, int64_t offset, int64_t numel,
                    Copy copy) {
    int64_t done = 0;
    for (const AdamW::MomentRange& r : ranges) {
        const int64_t lo = std::max(offset, r.offset);
        const int64_t hi = std::min(offset + numel, r.offset + r.numel);
        if (lo >= hi) continue;
        copy(r.m + (lo - r.offset), r.v + (lo - r.offset), lo - offset, hi - lo);
        done += hi - lo;
    }
    return done;
}

}  // namespace

ExpertBalancer::ExpertBalancer(Model& model, AdamW& optimizer, parallel::Communicator& ep,
                               parallel::Communicator& edp, int64_t rebalance_every)
    : model_(model),
      optimizer_(optimizer),
      ep_(ep),
      edp_(edp),
      rebalance_every_(rebalance_every),
      moments_sharded_(optimizer.grad_sync().options().zero1 && edp.size() > 1) {
    const int64_t E = model.config().n_routed_experts;
    step_record_.resize(static_cast<size_t>(model.num_moe_layers()) + 1);
    record_of_rank_.resize(step_record_.size() * static_cast<size_t>(ep.size()));
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
        t.numel = e.numel;
        t.per_slot = e.numel / slots;
        for (const AdamW::MomentRange& r : ranges)
            if (r.offset < e.offset + e.numel && r.offset + r.numel > e.offset)
                t.moments.push_back(r);
        std::sort(t.moments.begin(), t.moments.end(),
                  [](const auto& a, const auto& b) { return a.offset < b.offset; });
        // Every layer's experts are alike: the layer's moment buffer holds any layer's tensors
        // at the same places.
        t.in_layer = 0;
        for (const SlotTensor& before : tensors_)
            if (before.moe_layer == layer) t.in_layer += before.numel;
        if (layer == 0) {
            slot_floats_ += 3 * t.per_slot;
            layer_floats_ += t.numel;
        }
        layers = std::max(layers, layer + 1);
        tensors_.push_back(std::move(t));
    }
    average_.assign(static_cast<size_t>(layers), std::vector<double>(static_cast<size_t>(E), 0.0));
    last_load_ = average_;
    // A rank receives at most its own slots, but may be the source of every other rank's.
    const auto buffer = static_cast<size_t>(slots * slot_floats_);
    staging_.resize(buffer);
    layer_moments_.resize(static_cast<size_t>(2 * layer_floats_));
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
    // One gather per step, not one per figure: the rows of every MoE layer, then the expert
    // compute time's bits (a host collective's latency is the whole cost of so few bytes).
    const size_t layers = step_record_.size() - 1;
    model_.take_expert_rows(std::span(step_record_).first(layers));
    step_record_[layers] = std::bit_cast<int64_t>(expert_compute_s);
    ep_.all_gather(record_of_rank_.data(), step_record_.data(), step_record_.size(), DType::i64,
                   kHostStream);
    const size_t ranks = static_cast<size_t>(ep_.size());
    for (size_t rank = 0; rank < ranks; ++rank) {
        const double s =
            std::bit_cast<double>(record_of_rank_[rank * step_record_.size() + layers]);
        r.expert_compute_max_s = std::max(r.expert_compute_max_s, s);
        r.expert_compute_mean_s += s / static_cast<double>(ranks);
    }
    for (size_t l = 0; l < layers; ++l) {
        int64_t max_rows = 0, total_rows = 0;
        for (size_t rank = 0; rank < ranks; ++rank) {
            const int64_t rows = record_of_rank_[rank * step_record_.size() + l];
            max_rows = std::max(max_rows, rows);
            total_rows += rows;
        }
        if (total_rows == 0) continue;  // a layer of another pipeline stage
        r.rank_load_max_over_mean = std::max(
            r.rank_load_max_over_mean, static_cast<double>(max_rows) * static_cast<double>(ranks) /
                                           static_cast<double>(total_rows));
    }
    for (size_t l = 0; l < load.tokens_per_expert.size(); ++l) {
        if (l >= average_.size()) continue;  // no rebalancing
        const std::vector<int64_t>& counts = load.tokens_per_expert[l];
        std::vector<double>& layer_load = last_load_[l];
        std::copy(counts.begin(), counts.end(), layer_load.begin());
        std::vector<double>& average = average_[l];
        for (size_t e = 0; e < average.size(); ++e)
            average[e] = has_average_
                             ? kAverageDecay * average[e] + (1 - kAverageDecay) * layer_load[e]
                             : layer_load[e];
    }
    has_average_ = true;
    if (rebalance_every_ == 0) return r;
    if (step % rebalance_every_ != 0) {
        // Between rebalances the slots stay and the replicas' shares follow the last step's
        // loads: the loads drift faster than the average, and new shares move nothing.
        for (size_t l = 0; l < average_.size(); ++l) {
            const auto layer = static_cast<int64_t>(l);
            parallel::balanced_shares(*model_.expert_placement(layer), last_load_[l], shares_);
            model_.set_expert_shares(layer, shares_.share);
        }
        return r;
    }

    r.rebalanced = true;
    Timer timer;
    for (size_t l = 0; l < average_.size(); ++l) {
        const auto layer = static_cast<int64_t>(l);
        const parallel::ExpertPlacement& now = *model_.expert_placement(layer);
        const parallel::ExpertPlacement balanced =
            parallel::balanced_placement(average_[l], now.shape);
        r.average_max_over_mean_before =
            std::max(r.average_max_over_mean_before, parallel::rank_imbalance(now, average_[l]));
        r.average_max_over_mean_after = std::max(r.average_max_over_mean_after,
                                                 parallel::rank_imbalance(balanced, average_[l]));
        parallel::ExpertPlacement next = parallel::keep_slots_in_place(now, balanced);
        next.slot_share = parallel::balanced_shares(next, last_load_[l]);  // as between rebalances
        r.average_expert_load.resize(average_[l].size());
        for (size_t e = 0; e < average_[l].size(); ++e) r.average_expert_load[e] += average_[l][e];
        if (next == now) continue;
        if (next.slot_expert == now.slot_expert) {  // new shares only: nothing moves
            model_.set_expert_placement(layer, next);
            continue;
        }
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

std::vector<std::vector<int32_t>> ExpertBalancer::slot_shares() const {
    std::vector<std::vector<int32_t>> shares;
    for (int64_t l = 0; model_.expert_placement(0) != nullptr && l < num_moe_layers_; ++l)
        shares.push_back(model_.expert_placement(l)->slot_share);
    return shares;
}

bool ExpertBalancer::restore(const std::vector<std::vector<int32_t>>& slot_tables,
                             const std::vector<std::vector<int32_t>>& slot_shares,
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
    const bool with_shares = slot_shares.size() == slot_tables.size();  // else even shares
    for (int64_t l = 0; l < num_moe_layers_; ++l) {
        const auto i = static_cast<size_t>(l);
        const parallel::ExpertPlacement p = parallel::placement_from_slots(
            first->shape, slot_tables[i], with_shares ? slot_shares[i] : std::vector<int32_t>{});
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

void ExpertBalancer::gather_moments(int64_t moe_layer) {
    float* m = layer_moments_.data();
    float* v = m + layer_floats_;
    std::fill(layer_moments_.begin(), layer_moments_.end(), 0.0f);
    for (const SlotTensor& t : tensors_) {
        if (t.moe_layer != moe_layer) continue;
        const int64_t held =
            for_moments(t.moments, t.offset, t.numel,
                        [&](const float* rm, const float* rv, int64_t i, int64_t n) {
                            std::copy(rm, rm + n, m + t.in_layer + i);
                            std::copy(rv, rv + n, v + t.in_layer + i);
                        });
        MT_CHECK(moments_sharded_ || held == t.numel,
                 "[expert_balance] the moments cover {} of the {} floats of an expert tensor", held,
                 t.numel);
    }
    // The shards are disjoint and cover every float once: the sum over the EDP group adds zeros
    // to each, so it is exact.
    if (moments_sharded_)
        edp_.all_reduce_sum(layer_moments_.data(), layer_moments_.size(), DType::f32, kHostStream);
}

void ExpertBalancer::scatter_moments(int64_t moe_layer) {
    const float* m = layer_moments_.data();
    const float* v = m + layer_floats_;
    for (const SlotTensor& t : tensors_) {
        if (t.moe_layer != moe_layer) continue;
        for_moments(t.moments, t.offset, t.numel, [&](float* rm, float* rv, int64_t i, int64_t n) {
            std::copy(m + t.in_layer + i, m + t.in_layer + i + n, rm);
            std::copy(v + t.in_layer + i, v + t.in_layer + i + n, rv);
        });
    }
}

void ExpertBalancer::pack_slot(int64_t moe_layer, int64_t local_slot, float* out) const {
    const float* m = layer_moments_.data();
    const float* v = m + layer_floats_;
    for (const SlotTensor& t : tensors_) {
        if (t.moe_layer != moe_layer) continue;
        const int64_t at = local_slot * t.per_slot;
        std::copy(t.param + at, t.param + at + t.per_slot, out);
        std::copy(m + t.in_layer + at, m + t.in_layer + at + t.per_slot, out + t.per_slot);
        std::copy(v + t.in_layer + at, v + t.in_layer + at + t.per_slot, out + 2 * t.per_slot);
        out += 3 * t.per_slot;
    }
}

void ExpertBalancer::unpack_slot(int64_t moe_layer, int64_t local_slot, const float* in) {
    float* m = layer_moments_.data();
    float* v = m + layer_floats_;
    for (const SlotTensor& t : tensors_) {
        if (t.moe_layer != moe_layer) continue;
        const int64_t at = local_slot * t.per_slot;
        std::copy(in, in + t.per_slot, t.param + at);
        std::copy(in + t.per_slot, in + 2 * t.per_slot, m + t.in_layer + at);
        std::copy(in + 2 * t.per_slot, in + 3 * t.per_slot, v + t.in_layer + at);
        in += 3 * t.per_slot;
    }
}

void ExpertBalancer::migrate(int64_t moe_layer, const parallel::ExpertPlacement& from,
                             const parallel::ExpertPlacement& to) {
    const int64_t S = to.shape.slots_per_rank(), me = ep_.rank(), ranks = ep_.size();
    gather_moments(moe_layer);
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
    scatter_moments(moe_layer);
}

}  // namespace moetron
