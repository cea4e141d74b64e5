// Two-tier expert dispatch and combine (DeepEP's internode idea, DESIGN.md sec. 4): the EP group
// spans G scale-up domains of L consecutive ranks (EP rank r = g * L + l), and a token crosses the
// scale-out tier once per destination domain instead of once per destination rank.
//
//   layout:            the token's destination ranks and domains follow from its ids; its route
//                      record (source rank, ids, weights) travels the same path as its rows.
//   inter-domain hop:  one all_to_all_v on the rail (the G ranks with this rank's local index l):
//                      each token once to rank (g, l) of every domain g it reaches. A token bound
//                      for its own domain skips this stage (copied straight to the receive side).
//   intra-domain hop:  one all_to_all_v inside the domain: the forwarding rank (g, l) sends each
//                      forwarded row once to every rank of domain g that owns one of its experts.
//   expert side:       as in the flat dispatch; the expert rows are identical (same order too).
//   combine:           the reverse: each rank sums its experts' weighted outputs per row, the
//                      forwarding rank sums what its domain returns (one row per token and
//                      domain), the rail brings that back, and the source sums over domains.
// The backward of each operation is the other, as in dispatch_flat.h; the results equal the flat
// dispatch's (dispatch exactly, combine up to the order of the floating-point sums).
// With domain-limited routing (the router's groups mapped to domains, topk_group = M) a token
// reaches at most M domains, so the inter-domain rows per token are at most M, not K.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/dispatch_stage.h"

namespace moetron::parallel {

// The groups of the two stages, both restricted to the EP group: rail (G ranks, the same local
// index in every domain, rank = domain index) and domain (the L ranks of this rank's domain).
struct TwoTierGroups {
    Communicator* rail = nullptr;
    Communicator* domain = nullptr;
};

// Throws unless config.domain_size splits an EP group of ep_size ranks into two or more whole
// domains (ep a multiple of domain_size, and larger). With ep <= domain_size there is one domain
// and the flat dispatch is the same thing.
void check_two_tier(const DispatchConfig& config, int ep_size);

// The rail hop, then the domain hop, for rank ep_rank of an EP group of ep_size.
std::vector<HopSpec> two_tier_hops(const DispatchConfig& config, int ep_size, int ep_rank);

class TwoTierBuffer : public RouteBuffer {
  public:
    // In backend.memory() (RouteBuffer).
    TwoTierBuffer(const DispatchConfig& config, int ep_size, Backend& backend);
    static ArenaPlan plan(const DispatchConfig& config, int ep_size);
};

class TwoTierLayout : public Route {
  public:
    // Its ops run on backend (Route).
    TwoTierLayout(const DispatchConfig& config, int ep_size, int ep_rank, Backend& backend);

    int64_t num_recv_rows() const { return experts().num_rows(); }  // R
    std::span<const int64_t> expert_offsets() const { return experts().expert_offsets(); }
    // Rows this rank forwards inside its domain (received over the rail, own domain's included).
    int64_t num_forwarded_rows() const { return hop(0).num_recv(); }
};

// As dispatch_layout (dispatch_flat.h): collective over the rail, then over the domain.
void two_tier_layout(TwoTierLayout& layout, const int32_t* topk_ids, const float* topk_weights,
                     int64_t num_tokens, TwoTierBuffer& buffer, TwoTierGroups groups);
void dispatch_two_tier_forward(float* expert_inp, const float* inp, const TwoTierLayout& layout,
                               TwoTierBuffer& buffer, TwoTierGroups groups);
void dispatch_two_tier_backward(float* dinp, const float* dexpert_inp, const TwoTierLayout& layout,
                                TwoTierBuffer& buffer, TwoTierGroups groups);
void combine_two_tier_forward(float* out, const float* expert_out, const TwoTierLayout& layout,
                              TwoTierBuffer& buffer, TwoTierGroups groups);
void combine_two_tier_backward(float* dexpert_out, float* dweights, const float* dout,
                               const float* expert_out, const TwoTierLayout& layout,
                               TwoTierBuffer& buffer, TwoTierGroups groups);

}  // namespace moetron::parallel
