#include "moetron/parallel/dispatch_two_tier.h"

#include <algorithm>
#include <array>

#include "moetron/core/error.h"

namespace moetron::parallel {

void check_two_tier(const DispatchConfig& config, int ep_size) {
    config.validate(ep_size);
    MT_CHECK(config.domain_size >= 1 && config.domain_size < ep_size &&
                 ep_size % config.domain_size == 0,
             "[dispatch] two_tier needs an EP group of two or more whole domains: ep {} is not a "
             "multiple of domain_size {} larger than it (with ep <= domain_size the EP group is "
             "one domain and the flat dispatch is the same thing)",
             ep_size, config.domain_size);
}

std::vector<HopSpec> two_tier_hops(const DispatchConfig& config, int ep_size, int ep_rank) {
    check_two_tier(config, ep_size);
    const int L = static_cast<int>(config.domain_size), G = ep_size / L;
    const int g = ep_rank / L, l = ep_rank % L;
    const int64_t El = config.local_experts(ep_size), N = config.max_tokens, K = config.top_k;

    HopSpec rail;
    rail.name = "rail";
    rail.group_size = G;
    rail.self = g;
    for (int p = 0; p < G; ++p) rail.peer_is_remote.push_back(p != g);
    rail.to_peers = {0, config.num_experts, El * L};  // peer = the domain owning the expert
    rail.max_inputs = N;
    rail.max_slots = N * std::min<int64_t>(K, G);
    // From each rail peer: its tokens with an expert in this domain, each once, within the pair
    // budget towards the domain's L ranks.
    rail.max_recv = G * std::min(N, L * config.pair_rows(ep_size));

    HopSpec domain;
    domain.name = "domain";
    domain.group_size = L;
    domain.self = l;
    domain.peer_is_remote.assign(static_cast<size_t>(L), 0);
    domain.to_peers = {g * L * El, L * El, El};  // peer = the owning rank, this domain's experts
    domain.max_inputs = rail.max_recv;
    domain.max_slots = rail.max_recv * std::min<int64_t>(K, L);
    // Every source token once at most, within the pair budget.
    domain.max_recv = ep_size * config.recv_rows_per_source(ep_size);
    return {rail, domain};
}

TwoTierBuffer::TwoTierBuffer(const DispatchConfig& config, int ep_size, Backend& backend)
    : RouteBuffer(config, ep_size, two_tier_hops(config, ep_size, 0), backend) {}

ArenaPlan TwoTierBuffer::plan(const DispatchConfig& config, int ep_size) {
    return RouteBuffer::plan(config, two_tier_hops(config, ep_size, 0));
}

TwoTierLayout::TwoTierLayout(const DispatchConfig& config, int ep_size, int ep_rank,
                             Backend& backend)
    : Route(config, ep_size, ep_rank, two_tier_hops(config, ep_size, ep_rank), backend) {}

namespace {

std::array<Communicator*, 2> hop_groups(TwoTierGroups groups) {
    MT_CHECK(groups.rail != nullptr && groups.domain != nullptr,
             "[dispatch] two_tier needs both the rail and the domain group");
    return {groups.rail, groups.domain};
}

}  // namespace

void two_tier_layout(TwoTierLayout& layout, const int32_t* topk_ids, const float* topk_weights,
                     int64_t num_tokens, TwoTierBuffer& buffer, TwoTierGroups groups) {
    layout.plan(topk_ids, topk_weights, num_tokens, buffer, hop_groups(groups));
}

void dispatch_two_tier_forward(float* expert_inp, const float* inp, const TwoTierLayout& layout,
                               TwoTierBuffer& buffer, TwoTierGroups groups) {
    const auto g = hop_groups(groups);
    layout.check(buffer, g, "dispatch_two_tier_forward");
    layout.to_experts(expert_inp, inp, /*weighted=*/false, layout.config().token_format, buffer, g);
}

void dispatch_two_tier_backward(float* dinp, const float* dexpert_inp, const TwoTierLayout& layout,
                                TwoTierBuffer& buffer, TwoTierGroups groups) {
    const auto g = hop_groups(groups);
    layout.check(buffer, g, "dispatch_two_tier_backward");
    layout.to_tokens(dinp, dexpert_inp, /*weighted=*/false, buffer, g);
}

void combine_two_tier_forward(float* out, const float* expert_out, const TwoTierLayout& layout,
                              TwoTierBuffer& buffer, TwoTierGroups groups) {
    const auto g = hop_groups(groups);
    layout.check(buffer, g, "combine_two_tier_forward");
    layout.to_tokens(out, expert_out, /*weighted=*/true, buffer, g);
}

void combine_two_tier_backward(float* dexpert_out, float* dweights, const float* dout,
                               const float* expert_out, const TwoTierLayout& layout,
                               TwoTierBuffer& buffer, TwoTierGroups groups) {
    const auto g = hop_groups(groups);
    layout.check(buffer, g, "combine_two_tier_backward");
    layout.combine_grads(dexpert_out, dweights, dout, expert_out, buffer, g);
}

}  // namespace moetron::parallel
