#include "moetron/parallel/dispatch_flat.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::parallel {

std::vector<HopSpec> flat_hops(const DispatchConfig& config, int ep_size, int ep_rank) {
    config.validate(ep_size);
    const int64_t L = config.ranks_per_domain(ep_size);
    HopSpec h;
    h.name = "ep";
    h.group_size = ep_size;
    h.self = ep_rank;
    for (int p = 0; p < ep_size; ++p) h.peer_is_remote.push_back(p / L != ep_rank / L);
    h.to_peers = {0, config.num_experts, config.local_experts(ep_size)};
    h.max_inputs = config.max_tokens;
    h.max_slots = config.max_tokens * std::min<int64_t>(config.top_k, ep_size);
    // Every source token once at most, within the pair budget.
    h.max_recv = ep_size * config.recv_rows_per_source(ep_size);
    return {h};
}

DispatchBuffer::DispatchBuffer(const DispatchConfig& config, int ep_size, Backend& backend)
    : RouteBuffer(config, ep_size, flat_hops(config, ep_size, 0), backend) {}

ArenaPlan DispatchBuffer::plan(const DispatchConfig& config, int ep_size) {
    return RouteBuffer::plan(config, flat_hops(config, ep_size, 0));
}

DispatchLayout::DispatchLayout(const DispatchConfig& config, int ep_size, int ep_rank,
                               Backend& backend)
    : Route(config, ep_size, ep_rank, flat_hops(config, ep_size, ep_rank), backend) {}

void dispatch_layout(DispatchLayout& layout, const int32_t* topk_ids, const float* topk_weights,
                     int64_t num_tokens, DispatchBuffer& buffer, Communicator& ep) {
    Communicator* groups[] = {&ep};
    layout.plan(topk_ids, topk_weights, num_tokens, buffer, groups);
}

void dispatch_forward(float* expert_inp, const float* inp, const DispatchLayout& layout,
                      DispatchBuffer& buffer, Communicator& ep) {
    Communicator* groups[] = {&ep};
    layout.check(buffer, groups, "dispatch_forward");
    layout.to_experts(expert_inp, inp, /*weighted=*/false, layout.config().token_format, buffer,
                      groups);
}

void dispatch_backward(float* dinp, const float* dexpert_inp, const DispatchLayout& layout,
                       DispatchBuffer& buffer, Communicator& ep) {
    Communicator* groups[] = {&ep};
    layout.check(buffer, groups, "dispatch_backward");
    layout.to_tokens(dinp, dexpert_inp, /*weighted=*/false, buffer, groups);
}

void combine_forward(float* out, const float* expert_out, const DispatchLayout& layout,
                     DispatchBuffer& buffer, Communicator& ep) {
    Communicator* groups[] = {&ep};
    layout.check(buffer, groups, "combine_forward");
    layout.to_tokens(out, expert_out, /*weighted=*/true, buffer, groups);
}

void combine_backward(float* dexpert_out, float* dweights, const float* dout,
                      const float* expert_out, const DispatchLayout& layout, DispatchBuffer& buffer,
                      Communicator& ep) {
    Communicator* groups[] = {&ep};
    layout.check(buffer, groups, "combine_backward");
    layout.combine_grads(dexpert_out, dweights, dout, expert_out, buffer, groups);
}

}  // namespace moetron::parallel
