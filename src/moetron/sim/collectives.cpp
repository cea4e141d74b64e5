#include "moetron/sim/collectives.h"

#include <algorithm>
#include <cmath>

#include "moetron/core/error.h"

namespace moetron::sim {

namespace {

double n_of(const GroupPlacement& g) {
    return static_cast<double>(g.size);
}

// Bandwidth of a ring that visits all members. Across domains NCCL runs several rings
// (channels), each leaving a domain through a different NIC, so a group with r members in a
// domain can use r NICs at once: nccl-tests reach ~370 GB/s all-reduce bus bandwidth across
// DGX H100 nodes (8 x 50 GB/s NICs), not one NIC's 50 GB/s. NVLink bounds it from above.
// kind_efficiency, when above 0, replaces both tiers' efficiency (a collective measured on its
// own: EfficiencyParams::reduce_scatter_bw, all_gather_bw).
double ring_bandwidth(const ClusterSpec& c, const GroupPlacement& g, double kind_efficiency = 0) {
    const double up =
        kind_efficiency > 0 ? c.scale_up.bytes_per_s * kind_efficiency : scale_up_bandwidth(c);
    if (g.domains <= 1) return up;
    const double nics = static_cast<double>(g.ranks_per_domain);
    const double out = kind_efficiency > 0
                           ? c.scale_out.bytes_per_s * kind_efficiency * spine_congestion(c, g)
                           : scale_out_bandwidth(c, g);
    return std::min(up, nics * out);
}

double ring_alpha(const ClusterSpec& c, const GroupPlacement& g) {
    return g.domains > 1 ? c.scale_out.latency_s : c.scale_up.latency_s;
}

// One pass around the ring (reduce-scatter, all-gather): n - 1 steps, each rank moving
// (n - 1) / n of the buffer.
CommCost ring_pass(const ClusterSpec& c, const GroupPlacement& g, double bytes,
                   double kind_efficiency) {
    CommCost r;
    r.algorithm = "ring";
    if (g.size <= 1) return r;
    const double n = n_of(g);
    const double moved = (n - 1) / n * bytes;
    r.time_s = (n - 1) * ring_alpha(c, g) + moved / ring_bandwidth(c, g, kind_efficiency);
    (g.domains > 1 ? r.scale_out_bytes : r.scale_up_bytes) = moved;
    return r;
}

}  // namespace

double scale_up_bandwidth(const ClusterSpec& c) {
    return c.scale_up.bytes_per_s * c.efficiency.scale_up_bw;
}
double scale_out_bandwidth(const ClusterSpec& c) {
    return c.scale_out.bytes_per_s * c.efficiency.scale_out_bw;
}
double spine_congestion(const ClusterSpec& c, const GroupPlacement& g) {
    const int64_t domains_per_leaf = c.scale_out.switch_radix / 2;
    const bool crosses_spine = c.scale_out.switch_radix > 0 && g.domains > domains_per_leaf;
    return crosses_spine ? c.scale_out.spine_efficiency : 1.0;
}
double scale_out_bandwidth(const ClusterSpec& c, const GroupPlacement& g) {
    return scale_out_bandwidth(c) * spine_congestion(c, g);
}

CommCost all_reduce_ring(const ClusterSpec& c, const GroupPlacement& g, double bytes) {
    CommCost r;
    r.algorithm = "ring";
    if (g.size <= 1) return r;
    const double n = n_of(g);
    const double moved = 2 * (n - 1) / n * bytes;
    r.time_s = 2 * (n - 1) * ring_alpha(c, g) + moved / ring_bandwidth(c, g);
    (g.domains > 1 ? r.scale_out_bytes : r.scale_up_bytes) = moved;
    return r;
}

CommCost all_reduce_tree(const ClusterSpec& c, const GroupPlacement& g, double bytes) {
    CommCost r;
    r.algorithm = "tree";
    if (g.size <= 1) return r;
    // Double binary tree: log2(n) hops up and down, pipelined; each rank moves ~2x the buffer.
    const double hops = 2 * std::ceil(std::log2(n_of(g)));
    r.time_s = hops * ring_alpha(c, g) + 2 * bytes / ring_bandwidth(c, g);
    (g.domains > 1 ? r.scale_out_bytes : r.scale_up_bytes) = 2 * bytes;
    return r;
}

CommCost all_reduce_nvls(const ClusterSpec& c, const GroupPlacement& g, double bytes) {
    MT_CHECK(c.scale_up.in_switch_reduction, "[sim] {} has no in-switch reduction (NVLS)", c.name);
    CommCost r;
    if (g.size <= 1) return r;
    const double bw_up = scale_up_bandwidth(c);
    if (g.domains <= 1) {
        r.algorithm = "nvls";
        r.time_s = 2 * c.scale_up.latency_s + bytes / bw_up;
        r.scale_up_bytes = bytes;
        return r;
    }
    r.algorithm = "nvls-tree";
    const double d = static_cast<double>(g.domains);
    const double shard = bytes / static_cast<double>(g.ranks_per_domain);
    const double across = 2 * (d - 1) / d * shard;
    r.time_s = 2 * c.scale_up.latency_s + bytes / bw_up + 2 * (d - 1) * c.scale_out.latency_s +
               across / scale_out_bandwidth(c, g);
    r.scale_up_bytes = bytes;
    r.scale_out_bytes = across;
    return r;
}

CommCost all_reduce_cost(const ClusterSpec& c, const GroupPlacement& g, double bytes) {
    CommCost best = all_reduce_ring(c, g, bytes);
    CommCost tree = all_reduce_tree(c, g, bytes);
    if (tree.time_s < best.time_s) best = tree;
    if (c.scale_up.in_switch_reduction && g.size > 1) {
        CommCost nvls = all_reduce_nvls(c, g, bytes);
        if (nvls.time_s < best.time_s) best = nvls;
    }
    return best;
}

CommCost reduce_scatter_cost(const ClusterSpec& c, const GroupPlacement& g, double bytes) {
    return ring_pass(c, g, bytes, c.efficiency.reduce_scatter_bw);
}

CommCost all_gather_cost(const ClusterSpec& c, const GroupPlacement& g, double bytes) {
    // The same ring, data flowing the other way.
    return ring_pass(c, g, bytes, c.efficiency.all_gather_bw);
}

CommCost all_to_all_flat(const ClusterSpec& c, const GroupPlacement& g, double bytes) {
    CommCost r;
    r.algorithm = "flat";
    if (g.size <= 1) return r;
    const double n = n_of(g);
    const double r_local = static_cast<double>(g.ranks_per_domain);
    r.scale_up_bytes = bytes * (r_local - 1) / n;
    r.scale_out_bytes = bytes * (n - r_local) / n;
    const double a2a = c.efficiency.all_to_all_bw;
    const double up_s = r.scale_up_bytes / (c.scale_up.bytes_per_s * a2a);
    const double out_s =
        r.scale_out_bytes / (c.scale_out.bytes_per_s * a2a * spine_congestion(c, g));
    const double alpha = g.domains > 1 ? c.scale_out.latency_s : c.scale_up.latency_s;
    r.time_s = alpha + std::max(up_s, out_s);
    return r;
}

CommCost moe_dispatch_bytes(const parallel::DispatchFanout& fanout, parallel::DispatchKind kind,
                            double tokens, double token_bytes) {
    const parallel::TierRows rows = parallel::dispatch_rows(kind, fanout);
    CommCost r;
    r.algorithm = kind == parallel::DispatchKind::flat ? "flat" : "two-tier";
    r.scale_up_bytes = tokens * rows.intra_domain * token_bytes;
    r.scale_out_bytes = tokens * rows.inter_domain * token_bytes;
    return r;
}

CommCost moe_dispatch_cost(const ClusterSpec& c, const GroupPlacement& ep_group,
                           const parallel::DispatchFanout& fanout, parallel::DispatchKind kind,
                           double tokens, double token_bytes) {
    if (ep_group.size <= 1) return CommCost{0, 0, 0, "local"};
    CommCost r = moe_dispatch_bytes(fanout, kind, tokens, token_bytes);
    const double a2a = c.efficiency.all_to_all_bw;
    const double up_s = r.scale_up_bytes / (c.scale_up.bytes_per_s * a2a);
    const double out_s =
        r.scale_out_bytes / (c.scale_out.bytes_per_s * a2a * spine_congestion(c, ep_group));
    const double alpha = ep_group.domains > 1 ? c.scale_out.latency_s : c.scale_up.latency_s;
    r.time_s = alpha + std::max(up_s, out_s);
    return r;
}

CommCost send_recv_cost(const ClusterSpec& c, bool cross_domain, double bytes) {
    CommCost r;
    r.algorithm = "p2p";
    if (cross_domain) {
        r.time_s = c.scale_out.latency_s + bytes / scale_out_bandwidth(c);
        r.scale_out_bytes = bytes;
    } else {
        r.time_s = c.scale_up.latency_s + bytes / scale_up_bandwidth(c);
        r.scale_up_bytes = bytes;
    }
    return r;
}

}  // namespace moetron::sim
