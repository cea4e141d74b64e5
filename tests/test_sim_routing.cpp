// sim/routing: the expected fan-out formulas against brute-force enumeration of every routing
// choice on small shapes, and the DeepSeek-V3 numbers quoted in routing.h.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/sim/routing.h"

namespace moetron::sim {
namespace {

// Every way to pick `k` items of `pool`, calling f on each.
void for_each_subset(const std::vector<int>& pool, int k, std::vector<int>& cur, size_t start,
                     const std::function<void(const std::vector<int>&)>& f) {
    if (static_cast<int>(cur.size()) == k) {
        f(cur);
        return;
    }
    for (size_t i = start; i < pool.size(); ++i) {
        cur.push_back(pool[i]);
        for_each_subset(pool, k, cur, i + 1, f);
        cur.pop_back();
    }
}

// Exact expectation by enumeration: groups uniformly, then experts uniformly among them.
RoutingFanout brute_force(const RoutingShape& s) {
    const int e_per_group = static_cast<int>(s.num_experts / s.num_groups);
    const int e_per_rank = static_cast<int>(s.num_experts / s.ep);
    std::vector<int> groups(static_cast<size_t>(s.num_groups));
    for (size_t g = 0; g < groups.size(); ++g) groups[g] = static_cast<int>(g);
    double ranks = 0, domains = 0, weight = 0;
    std::vector<int> cur;
    for_each_subset(
        groups, static_cast<int>(s.topk_group), cur, 0, [&](const std::vector<int>& gs) {
            std::vector<int> experts;
            for (int g : gs) {
                for (int x = 0; x < e_per_group; ++x) experts.push_back(g * e_per_group + x);
            }
            std::vector<int> pick;
            std::vector<double> acc(2, 0);
            double count = 0;
            for_each_subset(
                experts, static_cast<int>(s.topk), pick, 0, [&](const std::vector<int>& ex) {
                    std::set<int> r, d;
                    for (int x : ex) {
                        r.insert(x / e_per_rank);
                        d.insert(x / e_per_rank / static_cast<int>(s.ep_ranks_per_domain));
                    }
                    acc[0] += static_cast<double>(r.size());
                    acc[1] += static_cast<double>(d.size());
                    count += 1;
                });
            ranks += acc[0] / count;
            domains += acc[1] / count;
            weight += 1;
        });
    RoutingFanout f;
    f.distinct_ranks = ranks / weight;
    f.distinct_domains = domains / weight;
    return f;
}

TEST(SimRouting, MatchesEnumerationOnSmallShapes) {
    const std::vector<RoutingShape> shapes = {
        // E, G, M, K, ep, ep ranks per domain
        {8, 4, 2, 2, 4, 2},    // groups smaller than ranks' blocks
        {12, 3, 2, 3, 6, 3},   // a group spans two ranks
        {16, 8, 3, 4, 4, 1},   // every rank its own domain
        {8, 1, 1, 3, 8, 4},    // no group limit
        {16, 4, 4, 5, 16, 4},  // every group chosen
    };
    for (const RoutingShape& s : shapes) {
        const RoutingFanout want = brute_force(s);
        const RoutingFanout got = expected_fanout(s);
        EXPECT_NEAR(got.distinct_ranks, want.distinct_ranks, 1e-9) << s.num_experts;
        EXPECT_NEAR(got.distinct_domains, want.distinct_domains, 1e-9) << s.num_experts;
        const double n = static_cast<double>(s.ep);
        EXPECT_NEAR(got.remote_ranks, want.distinct_ranks * (n - 1) / n, 1e-9);
    }
}

TEST(SimRouting, DeepSeekV3OnEightNodes) {
    // EP64 over 8 HGX nodes: one of the 8 groups per node (routing.h's worked example).
    RoutingShape s{256, 8, 4, 8, 64, 8};
    const RoutingFanout f = expected_fanout(s);
    double miss = 1;
    for (int i = 0; i < 8; ++i) miss *= (96.0 - i) / (128.0 - i);
    EXPECT_NEAR(f.distinct_domains, 8 * 0.5 * (1 - miss), 1e-9);
    EXPECT_NEAR(f.distinct_domains, 3.63, 0.01);
    EXPECT_NEAR(f.remote_domains, 3.17, 0.01);
    // Node-limited routing never needs more than topk_group = 4 domains.
    EXPECT_LE(f.distinct_domains, 4.0);
    // A token reaches fewer distinct ranks than its 8 experts (two can share a rank).
    EXPECT_LT(f.distinct_ranks, 8.0);
    EXPECT_GT(f.distinct_ranks, f.distinct_domains);
}

TEST(SimRouting, OneDomainHasNoRemoteDomains) {
    RoutingShape s{256, 8, 4, 8, 32, 32};
    const RoutingFanout f = expected_fanout(s);
    EXPECT_DOUBLE_EQ(f.distinct_domains, 1.0);
    EXPECT_DOUBLE_EQ(f.remote_domains, 0.0);
}

TEST(SimRouting, RejectsImpossibleShapes) {
    EXPECT_THROW(expected_fanout({256, 8, 4, 200, 32, 8}), Error);  // K > M * E/G
    EXPECT_THROW(expected_fanout({256, 8, 9, 8, 32, 8}), Error);    // M > G
    EXPECT_THROW(expected_fanout({256, 8, 4, 8, 48, 8}), Error);    // ep does not divide E
    EXPECT_THROW(expected_fanout({256, 7, 4, 8, 32, 8}), Error);    // G does not divide E
}

}  // namespace
}  // namespace moetron::sim
