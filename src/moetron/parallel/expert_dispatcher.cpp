#include "moetron/parallel/expert_dispatcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/parallel/dispatch_flat.h"
#include "moetron/parallel/dispatch_two_tier.h"

namespace moetron::parallel {

DispatchKind parse_dispatch_kind(std::string_view name) {
    if (name == "flat") return DispatchKind::flat;
    if (name == "two_tier") return DispatchKind::two_tier;
    MT_THROW("[dispatch] unknown dispatch '{}'; use flat or two_tier", name);
}

std::string_view dispatch_kind_name(DispatchKind kind) {
    return kind == DispatchKind::two_tier ? "two_tier" : "flat";
}

int64_t pair_rows_for_capacity_factor(const ExpertDispatchConfig& config, int ep_size) {
    MT_CHECK(config.capacity_factor >= 0 && std::isfinite(config.capacity_factor),
             "[expert_dispatch] the MoE capacity factor must be a finite number >= 0 (0: the "
             "worst case), got {}",
             config.capacity_factor);
    const DispatchConfig& c = config.routing;
    if (config.capacity_factor == 0 || ep_size < 1 || c.num_experts % ep_size != 0) return 0;
    const int64_t El = c.local_experts(ep_size);
    const int64_t one_token = std::min(c.top_k, El);
    const int64_t worst = c.max_tokens * one_token;
    const double balanced = static_cast<double>(c.max_tokens * c.top_k) / ep_size;
    const double planned = std::ceil(config.capacity_factor * balanced);
    if (planned >= static_cast<double>(worst)) return 0;
    return std::max(one_token, static_cast<int64_t>(planned));
}

DispatchConfig planned_routing(const ExpertDispatchConfig& config, int ep_size) {
    DispatchConfig d = config.routing;
    d.pair_capacity_rows = pair_rows_for_capacity_factor(config, ep_size);
    return d;
}

namespace {

void check_config(const ExpertDispatchConfig& config) {
    const DispatchConfig& c = config.routing;
    MT_CHECK(c.num_experts >= 1 && c.top_k >= 1 && c.top_k <= c.num_experts && c.hidden >= 1 &&
                 c.max_tokens >= 0 && config.num_slots >= 0 && config.num_buffers >= 1,
             "[expert_dispatch] bad config: E {} K {} D {} max_tokens {} slots {} buffers {}",
             c.num_experts, c.top_k, c.hidden, c.max_tokens, config.num_slots, config.num_buffers);
}

void check_slot(int64_t slot, int64_t num_slots) {
    MT_CHECK(slot >= 0 && slot < num_slots, "[expert_dispatch] slot {} is not in [0, {})", slot,
             num_slots);
}

// Every expert here: the copies sorted by expert, stably in the copy index (the same order as the
// flat dispatcher with one rank).
class LocalDispatcher final : public ExpertDispatcher {
  public:
    LocalDispatcher(const ExpertDispatchConfig& c, Backend& backend)
        : config_(c), backend_(backend), codec_(c.routing.token_format, c.routing.hidden, backend) {
        check_config(c);
        token_format_ = c.routing.token_format;
        num_local_experts_ = c.routing.num_experts;
        first_local_expert_ = 0;
        description_ = "local (every expert in this process)";
        slots_.resize(static_cast<size_t>(c.num_slots));
        for (Slot& s : slots_) {
            s.copy_to_row.resize(static_cast<size_t>(c.routing.max_tokens * c.routing.top_k));
            s.expert_offsets.resize(static_cast<size_t>(c.routing.num_experts + 1));
        }
    }

    const char* kind() const override { return "local"; }
    int64_t capacity_rows() const override {
        return config_.routing.max_tokens * config_.routing.top_k;
    }
    size_t buffer_bytes() const override {
        size_t bytes = 0;
        for (const Slot& s : slots_)
            bytes +=
                s.copy_to_row.size() * sizeof(int32_t) + s.expert_offsets.size() * sizeof(int64_t);
        return bytes;
    }

    void route(int64_t slot, const int32_t* topk_ids, const float* /*topk_weights*/,
               int64_t num_tokens, int64_t /*first_token*/) override {
        MT_CHECK(num_tokens >= 0 && num_tokens <= config_.routing.max_tokens,
                 "[expert_dispatch] {} tokens, but the dispatcher holds at most {}", num_tokens,
                 config_.routing.max_tokens);
        Slot& s = at(slot);
        s.num_tokens = num_tokens;
        s.round_end = num_tokens;
        backend_.moe_permute_layout(s.copy_to_row.data(), s.expert_offsets.data(), topk_ids,
                                    num_tokens, config_.routing.top_k, config_.routing.num_experts);
    }
    // Every copy stays here and the buffers hold them all: one round.
    std::span<const int64_t> plan_rounds(int64_t slot, const int32_t* /*topk_ids*/,
                                         int64_t num_tokens) override {
        Slot& s = at(slot);
        s.round_end = num_tokens;
        return {&s.round_end, 1};
    }
    std::span<const int64_t> round_ends(int64_t slot) const override {
        return {&at(slot).round_end, 1};
    }
    int64_t num_expert_rows(int64_t slot) const override {
        return at(slot).num_tokens * config_.routing.top_k;
    }
    std::span<const int64_t> expert_offsets(int64_t slot) const override {
        return at(slot).expert_offsets;
    }

    // Nothing travels: each movement is complete when begun.
    void dispatch_forward_begin(int64_t slot, float* expert_inp, const float* inp,
                                Precision token_format) override {
        config_.routing.check_token_format(token_format);
        const Slot& s = at(slot);
        backend_.permute_forward(expert_inp, inp, s.copy_to_row.data(), s.num_tokens,
                                 config_.routing.top_k, config_.routing.hidden);
        // Each row is quantized on its own: the copies get what their token's row would.
        if (token_format != Precision::fp32)
            codec_.round_trip(expert_inp, s.num_tokens * config_.routing.top_k);
    }
    void combine_forward_begin(int64_t slot, float* out, const float* expert_out,
                               const float* weights, bool accumulate) override {
        const Slot& s = at(slot);
        if (accumulate)
            backend_.unpermute_add(out, expert_out, weights, s.copy_to_row.data(), s.num_tokens,
                                   config_.routing.top_k, config_.routing.hidden);
        else
            backend_.unpermute_forward(out, expert_out, weights, s.copy_to_row.data(), s.num_tokens,
                                       config_.routing.top_k, config_.routing.hidden);
    }
    void combine_backward_begin(int64_t slot, float* dexpert_out, float* dweights,
                                const float* dout, const float* weights,
                                const float* expert_out) override {
        const Slot& s = at(slot);
        backend_.unpermute_backward(dexpert_out, dweights, dout, expert_out, weights,
                                    s.copy_to_row.data(), s.num_tokens, config_.routing.top_k,
                                    config_.routing.hidden);
    }
    void dispatch_backward_begin(int64_t slot, float* dinp, const float* dexpert_inp,
                                 bool accumulate) override {
        const Slot& s = at(slot);
        if (accumulate)  // permute's backward, added: unpermute with weight 1
            backend_.unpermute_add(dinp, dexpert_inp, nullptr, s.copy_to_row.data(), s.num_tokens,
                                   config_.routing.top_k, config_.routing.hidden);
        else
            backend_.permute_backward(dinp, dexpert_inp, s.copy_to_row.data(), s.num_tokens,
                                      config_.routing.top_k, config_.routing.hidden);
    }
    void finish(int64_t slot) override { at(slot); }
    void post_next_hop(int64_t slot) override { at(slot); }

  private:
    struct Slot {
        int64_t num_tokens = 0;
        int64_t round_end = 0;
        std::vector<int32_t> copy_to_row;     // (max_tokens * K)
        std::vector<int64_t> expert_offsets;  // (E + 1)
    };
    Slot& at(int64_t slot) {
        check_slot(slot, config_.num_slots);
        return slots_[static_cast<size_t>(slot)];
    }
    const Slot& at(int64_t slot) const {
        check_slot(slot, config_.num_slots);
        return slots_[static_cast<size_t>(slot)];
    }

    ExpertDispatchConfig config_;
    Backend& backend_;
    parallel::TokenRowCodec codec_;  // the wire format's rounding, with no wire
    std::vector<Slot> slots_;
};

// Experts split over the EP group; one route (Layout) per slot and one shared buffer (Buffer).
// Flat and two-tier differ only in their hops and groups (dispatch_stage.h).
template <class Layout, class Buffer>
class RoutedDispatcher final : public ExpertDispatcher {
  public:
    RoutedDispatcher(const ExpertDispatchConfig& c, Communicator& ep,
                     std::vector<Communicator*> groups, const char* kind, std::string description,
                     Backend& backend)
        : backend_(backend),
          ep_(ep),
          groups_(std::move(groups)),
          kind_(kind),
          placements_(c.placements),
          slots_per_placement_(c.routing_slots_per_placement),
          route_config_(planned_routing(c, ep.size())),
          rows_to_rank_(static_cast<size_t>(ep.size())),
          rounds_of_rank_(static_cast<size_t>(ep.size())) {
        check_config(c);
        if (placements_ != nullptr) {
            MT_CHECK(placements_->shape.num_slots == c.routing.num_experts &&
                         placements_->shape.ep_size == ep.size() && slots_per_placement_ >= 1,
                     "[expert_dispatch] the placement ({} slots over {} ranks) does not fit the "
                     "dispatch ({} slots over {} ranks)",
                     placements_->shape.num_slots, placements_->shape.ep_size,
                     c.routing.num_experts, ep.size());
            slot_ids_.resize(static_cast<size_t>(c.routing.max_tokens * c.routing.top_k));
        }
        buffers_.reserve(static_cast<size_t>(c.num_buffers));
        for (int64_t i = 0; i < c.num_buffers; ++i)
            buffers_.emplace_back(route_config_, ep.size(), backend);
        num_local_experts_ = route_config_.local_experts(ep.size());
        token_format_ = route_config_.token_format;
        first_local_expert_ = static_cast<int64_t>(ep.rank()) * num_local_experts_;
        description_ = std::move(description);
        slots_.reserve(static_cast<size_t>(c.num_slots));
        for (int64_t i = 0; i < c.num_slots; ++i)
            slots_.emplace_back(route_config_, ep.size(), ep.rank(), backend);
        transfers_ = std::vector<RouteTransfer>(static_cast<size_t>(c.num_slots));
        num_slots_ = c.num_slots;
        rounds_.resize(static_cast<size_t>(c.num_slots));
        for (Rounds& r : rounds_)
            r.ends.resize(static_cast<size_t>(std::max<int64_t>(1, c.routing.max_tokens)));
    }

    const char* kind() const override { return kind_; }
    int64_t capacity_rows() const override {
        return route_config_.capacity_rows(buffers_.front().ep_size());
    }
    size_t buffer_bytes() const override {
        size_t bytes = 0;  // the layouts' index arrays are small next to the rows
        for (const Buffer& b : buffers_) bytes += b.size_bytes();
        return bytes;
    }

    void route(int64_t slot, const int32_t* topk_ids, const float* topk_weights, int64_t num_tokens,
               int64_t first_token) override {
        Layout& layout = at(slot);
        MT_CHECK(!transfers_[static_cast<size_t>(slot)].in_flight(),
                 "[expert_dispatch] route() of slot {} while its movement is in flight", slot);
        layout.plan(to_slots(slot, topk_ids, num_tokens, first_token), topk_weights, num_tokens,
                    buffer_of(slot), groups_);
        const RoutingSpread& s = layout.spread();
        ++stats_.routes;
        stats_.spread.num_tokens += s.num_tokens;
        stats_.spread.rank_sum += s.rank_sum;
        stats_.spread.rank_max = std::max(stats_.spread.rank_max, s.rank_max);
        stats_.spread.domain_sum += s.domain_sum;
        stats_.spread.domain_max = std::max(stats_.spread.domain_max, s.domain_max);
    }
    std::span<const int64_t> plan_rounds(int64_t slot, const int32_t* topk_ids,
                                         int64_t num_tokens) override {
        at(slot);
        MT_CHECK(num_tokens >= 0 && num_tokens <= route_config_.max_tokens,
                 "[expert_dispatch] {} tokens, but the dispatcher holds at most {}", num_tokens,
                 route_config_.max_tokens);
        Rounds& r = rounds_[static_cast<size_t>(slot)];
        if (!route_config_.can_overflow(ep_.size())) {
            r.ends[0] = num_tokens;
            r.count = 1;
            return round_ends(slot);
        }
        const int64_t count =
            split_into_rounds(r.ends, rows_to_rank_, to_slots(slot, topk_ids, num_tokens, 0),
                              num_tokens, route_config_, ep_.size(), backend_);
        // Every rank takes the most rounds any rank needs.
        std::fill(rounds_of_rank_.begin(), rounds_of_rank_.end(), 0);
        rounds_of_rank_[static_cast<size_t>(ep_.rank())] = static_cast<double>(count);
        ep_.all_reduce_sum(std::span<double>(rounds_of_rank_), kHostStream);
        const auto agreed =
            static_cast<int64_t>(*std::max_element(rounds_of_rank_.begin(), rounds_of_rank_.end()));
        std::fill(r.ends.begin() + count, r.ends.begin() + agreed, num_tokens);
        r.count = agreed;
        if (agreed > 1) {
            ++stats_.overflowed_plans;
            stats_.extra_rounds += agreed - 1;
        }
        return round_ends(slot);
    }
    std::span<const int64_t> round_ends(int64_t slot) const override {
        at(slot);
        const Rounds& r = rounds_[static_cast<size_t>(slot)];
        return {r.ends.data(), static_cast<size_t>(r.count)};
    }
    int64_t num_expert_rows(int64_t slot) const override { return at(slot).experts().num_rows(); }
    std::span<const int64_t> expert_offsets(int64_t slot) const override {
        return at(slot).experts().expert_offsets();
    }

    void dispatch_forward_begin(int64_t slot, float* expert_inp, const float* inp,
                                Precision token_format) override {
        at(slot).begin_to_experts(transfer(slot), expert_inp, inp, /*weighted=*/false, token_format,
                                  buffer_of(slot), groups_);
    }
    void combine_forward_begin(int64_t slot, float* out, const float* expert_out,
                               const float* /*weights: the route's*/, bool accumulate) override {
        at(slot).begin_to_tokens(transfer(slot), out, expert_out, /*weighted=*/true, accumulate,
                                 buffer_of(slot), groups_);
    }
    void combine_backward_begin(int64_t slot, float* dexpert_out, float* dweights,
                                const float* dout, const float* /*weights: the route's*/,
                                const float* expert_out) override {
        at(slot).begin_combine_grads(transfer(slot), dexpert_out, dweights, dout, expert_out,
                                     buffer_of(slot), groups_);
    }
    void dispatch_backward_begin(int64_t slot, float* dinp, const float* dexpert_inp,
                                 bool accumulate) override {
        at(slot).begin_to_tokens(transfer(slot), dinp, dexpert_inp, /*weighted=*/false, accumulate,
                                 buffer_of(slot), groups_);
    }
    void finish(int64_t slot) override { at(slot).finish(transfer(slot)); }
    void post_next_hop(int64_t slot) override { at(slot).post_next(transfer(slot)); }

    DispatchStats stats() const override {
        DispatchStats s = stats_;
        for (const Buffer& b : buffers_) {
            s.bytes.intra_domain += b.bytes_sent().intra_domain;
            s.bytes.inter_domain += b.bytes_sent().inter_domain;
        }
        return s;
    }
    void reset_stats() override {
        stats_ = {};
        for (Buffer& b : buffers_) b.bytes_sent() = {};
    }

  private:
    Layout& at(int64_t slot) {
        check_slot(slot, num_slots_);
        return slots_[static_cast<size_t>(slot)];
    }
    const Layout& at(int64_t slot) const {
        check_slot(slot, num_slots_);
        return slots_[static_cast<size_t>(slot)];
    }
    RouteTransfer& transfer(int64_t slot) { return transfers_[static_cast<size_t>(slot)]; }

    // With redundant experts, the logical expert ids (N, K) as the physical slots that serve them
    // (choose_replica: token t of the rank's share is first_token + t); else the ids themselves.
    // Host code: the ids must be in host memory (the CPU backend).
    const int32_t* to_slots(int64_t slot, const int32_t* topk_ids, int64_t num_tokens,
                            int64_t first_token) {
        if (placements_ == nullptr) return topk_ids;
        const ExpertPlacement& placement = placements_[slot / slots_per_placement_];
        const int64_t K = route_config_.top_k;
        MT_CHECK(num_tokens * K <= static_cast<int64_t>(slot_ids_.size()),
                 "[expert_dispatch] {} tokens, but the dispatcher holds at most {}", num_tokens,
                 route_config_.max_tokens);
        for (int64_t t = 0; t < num_tokens; ++t)
            for (int64_t j = 0; j < K; ++j) {
                const int32_t expert = topk_ids[t * K + j];
                MT_CHECK(expert >= 0 && expert < placement.shape.num_experts,
                         "[expert_dispatch] expert id {} is not one of the {} experts", expert,
                         placement.shape.num_experts);
                slot_ids_[static_cast<size_t>(t * K + j)] =
                    choose_replica(placement, expert, ep_.rank(), first_token + t);
            }
        return slot_ids_.data();
    }
    Buffer& buffer_of(int64_t slot) {
        return buffers_[static_cast<size_t>(slot) % buffers_.size()];
    }

    // The token ranges of a slot's rounds: ends[i] closes round i.
    struct Rounds {
        std::vector<int64_t> ends;  // (max(1, max_tokens)): a round holds one token at least
        int64_t count = 1;
    };

    Backend& backend_;                   // runs the routing ops and holds the buffers
    Communicator& ep_;                   // agrees on the rounds
    std::vector<Communicator*> groups_;  // one per hop
    const char* kind_;
    const ExpertPlacement* placements_;  // redundant experts' placements; null without
    int64_t slots_per_placement_;        // routing slots per placement (per MoE layer)
    std::vector<int32_t> slot_ids_;      // (max_tokens * K) to_slots' output
    DispatchConfig route_config_;
    std::vector<int64_t> rows_to_rank_;   // (ep) scratch of plan_rounds
    std::vector<double> rounds_of_rank_;  // (ep) scratch of plan_rounds (sums: f32, f64 only)
    std::vector<Rounds> rounds_;          // (num_slots)
    std::vector<Buffer> buffers_;         // (num_buffers)
    std::vector<Layout> slots_;
    std::vector<RouteTransfer> transfers_;  // (num_slots) each slot's movement in flight
    int64_t num_slots_ = 0;
    DispatchStats stats_;
};

}  // namespace

namespace {

// Whether an EP group of ep_size ranks routes in two tiers: two_tier asked over several domains.
bool routes_in_two_tiers(const ExpertDispatchConfig& config, int ep_size) {
    return config.kind == DispatchKind::two_tier && config.routing.num_domains(ep_size) > 1;
}

}  // namespace

int64_t planned_expert_rows(const ExpertDispatchConfig& config, int ep_size) {
    if (ep_size <= 1) return config.routing.max_tokens * config.routing.top_k;  // LocalDispatcher
    return planned_routing(config, ep_size).capacity_rows(ep_size);
}

size_t planned_buffer_bytes(const ExpertDispatchConfig& config, int ep_size) {
    if (ep_size <= 1) {  // LocalDispatcher's Slot
        const auto per_slot =
            static_cast<size_t>(config.routing.max_tokens * config.routing.top_k) *
                sizeof(int32_t) +
            static_cast<size_t>(config.routing.num_experts + 1) * sizeof(int64_t);
        return per_slot * static_cast<size_t>(config.num_slots);
    }
    const DispatchConfig d = planned_routing(config, ep_size);
    const ArenaPlan one = routes_in_two_tiers(config, ep_size) ? TwoTierBuffer::plan(d, ep_size)
                                                               : DispatchBuffer::plan(d, ep_size);
    return one.total_bytes() * static_cast<size_t>(config.num_buffers);
}

std::unique_ptr<ExpertDispatcher> make_expert_dispatcher(const ExpertDispatchConfig& config,
                                                         const ExpertGroups& groups,
                                                         Backend& backend) {
    Communicator* ep = groups.ep;
    MT_CHECK(config.placements == nullptr || (ep != nullptr && ep->size() > 1),
             "[expert_dispatch] redundant experts need an EP group of more than one rank");
    if (ep == nullptr || ep->size() == 1) return std::make_unique<LocalDispatcher>(config, backend);
    const int64_t L = config.routing.ranks_per_domain(ep->size());
    const int64_t G = config.routing.num_domains(ep->size());
    if (!routes_in_two_tiers(config, ep->size())) {
        std::string why =
            config.kind == DispatchKind::flat
                ? fmt::format("flat over EP group '{}' of {} ranks", ep->name(), ep->size())
                : fmt::format(
                      "flat: two_tier asked, but EP group '{}' of {} ranks lies in one "
                      "domain of {} ranks, where both are the same",
                      ep->name(), ep->size(), L);
        return std::make_unique<RoutedDispatcher<DispatchLayout, DispatchBuffer>>(
            config, *ep, std::vector<Communicator*>{ep}, "flat", std::move(why), backend);
    }
    check_two_tier(planned_routing(config, ep->size()), ep->size());
    MT_CHECK(groups.rail != nullptr && groups.domain != nullptr,
             "[expert_dispatch] two_tier over EP group '{}' needs its rail and domain groups",
             ep->name());
    MT_CHECK(groups.rail->size() == G && groups.domain->size() == L &&
                 groups.rail->rank() * L + groups.domain->rank() == ep->rank(),
             "[expert_dispatch] two_tier: rail group '{}' (rank {} of {}) and domain group '{}' "
             "(rank {} of {}) do not split EP rank {} of {} into {} domains of {}",
             groups.rail->name(), groups.rail->rank(), groups.rail->size(), groups.domain->name(),
             groups.domain->rank(), groups.domain->size(), ep->rank(), ep->size(), G, L);
    return std::make_unique<RoutedDispatcher<TwoTierLayout, TwoTierBuffer>>(
        config, *ep, std::vector<Communicator*>{groups.rail, groups.domain}, "two_tier",
        fmt::format("two_tier over EP group '{}': {} domains of {} ranks (rail '{}', domain '{}')",
                    ep->name(), G, L, groups.rail->name(), groups.domain->name()),
        backend);
}

}  // namespace moetron::parallel
