// Collective costs with an alpha-beta model per tier: time = steps * alpha + bytes / bandwidth,
// where a step that crosses domains pays the scale-out alpha and a byte that crosses domains goes
// at the NIC's bandwidth, the rest at NVLink bandwidth (each times its efficiency). Sizes follow
// nccl-tests: `bytes` is the per-rank buffer of an all-reduce, the full (unsharded) buffer of a
// reduce-scatter or all-gather, and what one rank sends in total in an all-to-all.
#pragma once

#include <string>

#include "moetron/sim/hardware.h"
#include "moetron/sim/layout.h"
#include "moetron/sim/routing.h"

namespace moetron::sim {

struct CommCost {
    double time_s = 0;
    double scale_up_bytes = 0;   // bytes this rank sends over NVLink
    double scale_out_bytes = 0;  // bytes this rank sends over its NIC
    std::string algorithm;       // "ring", "tree", "nvls", "nvls-tree", "flat", "two-tier", ...
};

// Link bandwidths after efficiency (bytes/s per GPU per direction).
double scale_up_bandwidth(const ClusterSpec& c);
double scale_out_bandwidth(const ClusterSpec& c);
// The fraction of scale-out bandwidth a group keeps: spine_efficiency when it spans more
// domains than one leaf switch serves (flow collisions in the spine), else 1.
double spine_congestion(const ClusterSpec& c, const GroupPlacement& g);
double scale_out_bandwidth(const ClusterSpec& c, const GroupPlacement& g);

// All-reduce: the fastest of ring, double binary tree and (where the switches reduce) NVLS, the
// choice NCCL's tuner makes for large messages.
CommCost all_reduce_cost(const ClusterSpec& c, const GroupPlacement& g, double bytes);
CommCost all_reduce_ring(const ClusterSpec& c, const GroupPlacement& g, double bytes);
CommCost all_reduce_tree(const ClusterSpec& c, const GroupPlacement& g, double bytes);
// NVLS inside a domain (each GPU sends and receives the buffer once); across domains NVLS-tree:
// reduce-scatter in the domain, ring all-reduce of 1/r of the buffer across, all-gather back.
// Throws when the cluster has no in-switch reduction.
CommCost all_reduce_nvls(const ClusterSpec& c, const GroupPlacement& g, double bytes);

CommCost reduce_scatter_cost(const ClusterSpec& c, const GroupPlacement& g, double bytes);
CommCost all_gather_cost(const ClusterSpec& c, const GroupPlacement& g, double bytes);

// Flat all-to-all: each rank sends bytes/n to every rank; NVLink and NIC traffic proceed at once.
CommCost all_to_all_flat(const ClusterSpec& c, const GroupPlacement& g, double bytes);

// MoE dispatch (or combine: same bytes, opposite direction) of `tokens` tokens of
// `token_bytes` each from one rank, whose experts fan out as `fanout` per token (expected:
// expected_dispatch_fanout; or counted from a concrete routing). The bytes per tier are the
// engine's (parallel::dispatch_rows): flat sends a token once to each rank holding one of its
// experts, two-tier once to each such domain over the NIC and then to each such rank over NVLink.
CommCost moe_dispatch_cost(const ClusterSpec& c, const GroupPlacement& ep_group,
                           const parallel::DispatchFanout& fanout, parallel::DispatchKind kind,
                           double tokens, double token_bytes);
// Its bytes alone (time 0), which `moetron bench a2a` puts beside the bytes it measures.
CommCost moe_dispatch_bytes(const parallel::DispatchFanout& fanout, parallel::DispatchKind kind,
                            double tokens, double token_bytes);

// Point-to-point send of `bytes` to a pipeline neighbour in the same or another domain.
CommCost send_recv_cost(const ClusterSpec& c, bool cross_domain, double bytes);

}  // namespace moetron::sim
