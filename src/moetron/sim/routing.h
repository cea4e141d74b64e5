// Expected fan-out of MoE routing: to how many distinct EP ranks and scale-up domains one token's
// top-k experts go, under uniform (balanced) group-limited routing. These set the bytes of a
// deduplicated dispatch: a token crosses the scale-out tier once per remote domain it needs
// (DeepEP's two-tier idea) and NVLink once per remote rank it needs.
//
// Model (DeepSeek-V3's node-limited routing, uniform version): E experts in G groups of e = E/G
// consecutive experts; a token picks M = topk_group groups uniformly from G, then K distinct
// experts uniformly from the M*e experts of those groups. Experts sit on EP ranks in consecutive
// blocks of E/ep; ranks sit in domains in consecutive blocks of ep_ranks_per_domain.
//
// For one unit u (a rank or a domain) let I be the groups with experts in u, c_g the number of
// group g's experts in u. The token misses u iff none of its K experts is in u:
//   P(miss u) = sum over A subset of I of  P(chosen groups meet I exactly in A)
//                                          * C(M*e - c_A, K) / C(M*e, K),
//   P(chosen groups meet I in A) = C(G - |I|, M - |A|) / C(G, M),  c_A = sum of c_g over A.
// E[distinct units] = sum over u of (1 - P(miss u)). Routing does not depend on where the token
// lives, so its own unit is a uniformly random one of the n units and
//   E[remote units] = E[distinct units] * (n - 1) / n.
// Example, DeepSeek-V3 (E=256, G=8, M=4, K=8) on EP64 over 8 HGX nodes: one group per node,
// P(miss) = 1/2 + 1/2 * C(96,8)/C(128,8), so E[domains] = 8 * (1/2)(1 - 0.0935) = 3.63 and
// E[remote domains] = 3.17 instead of the 7 remote copies a flat all-to-all sends.
#pragma once

#include <cstdint>

#include "moetron/parallel/dispatch_traffic.h"

namespace moetron::sim {

struct RoutingShape {
    int64_t num_experts = 1;          // E
    int64_t num_groups = 1;           // G
    int64_t topk_group = 1;           // M
    int64_t topk = 1;                 // K
    int64_t ep = 1;                   // EP ranks
    int64_t ep_ranks_per_domain = 1;  // EP ranks inside one scale-up domain
};

struct RoutingFanout {
    double distinct_ranks = 0;    // E[EP ranks holding at least one of the token's experts]
    double remote_ranks = 0;      // the same, excluding the token's own rank
    double distinct_domains = 0;  // E[domains holding at least one of the token's experts]
    double remote_domains = 0;    // excluding the token's own domain
};

// Throws when the shape is impossible (K > M*e, ep not dividing E, ...).
RoutingFanout expected_fanout(const RoutingShape& shape);

// The expected fanout per token that parallel::dispatch_rows turns into rows per tier, the
// engine's formula. Routing does not depend on where the token lives, so for n EP ranks in G
// domains of L: E[own-domain ranks] = R (L-1)/n, E[other-domain ranks] = R (n-L)/n, E[other
// domains] = D (G-1)/G and E[landings] = R (G-1)/n (each rank is the landing rank of the G-1
// ranks with its local index in other domains), with R, D = distinct_ranks, distinct_domains.
parallel::DispatchFanout expected_dispatch_fanout(const RoutingShape& shape);

}  // namespace moetron::sim
