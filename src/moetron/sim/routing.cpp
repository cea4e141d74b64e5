#include "moetron/sim/routing.h"

#include <cmath>
#include <map>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::sim {

namespace {

double log_binomial(int64_t n, int64_t k) {
    return std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(k) + 1) -
           std::lgamma(static_cast<double>(n - k) + 1);
}

double binomial(int64_t n, int64_t k) {
    if (k < 0 || k > n) return 0;
    return std::exp(log_binomial(n, k));
}

// C(a, k) / C(b, k) for a <= b, computed as a product to stay exact for small k.
double binomial_ratio(int64_t a, int64_t b, int64_t k) {
    if (a < k) return 0;
    double r = 1;
    for (int64_t i = 0; i < k; ++i) r *= static_cast<double>(a - i) / static_cast<double>(b - i);
    return r;
}

// P(no expert of the token lands in a unit holding c_g experts of each group g in `counts`).
double miss_probability(const std::vector<int64_t>& counts, const RoutingShape& s) {
    const int64_t experts_per_group = s.num_experts / s.num_groups;
    const int64_t candidates = s.topk_group * experts_per_group;
    const int64_t touched = static_cast<int64_t>(counts.size());
    // ways[j][c]: subsets of the touched groups with j groups and c experts inside the unit.
    std::vector<std::map<int64_t, double>> ways(touched + 1);
    ways[0][0] = 1;
    for (int64_t c_g : counts) {
        for (int64_t j = touched - 1; j >= 0; --j) {
            for (const auto& [c, w] : ways[j]) ways[j + 1][c + c_g] += w;
        }
    }
    const double all_group_choices = binomial(s.num_groups, s.topk_group);
    double miss = 0;
    for (int64_t j = 0; j <= std::min(touched, s.topk_group); ++j) {
        const double p_groups =
            binomial(s.num_groups - touched, s.topk_group - j) / all_group_choices;
        if (p_groups == 0) continue;
        for (const auto& [c, w] : ways[j]) {
            miss += w * p_groups * binomial_ratio(candidates - c, candidates, s.topk);
        }
    }
    return miss;
}

// Expected units hit when experts are split into `units` consecutive blocks.
double expected_units_hit(int64_t units, const RoutingShape& s) {
    const int64_t experts_per_unit = s.num_experts / units;
    const int64_t experts_per_group = s.num_experts / s.num_groups;
    double hit = 0;
    // Units with the same group pattern share the probability; cache by pattern.
    std::map<std::vector<int64_t>, double> cache;
    for (int64_t u = 0; u < units; ++u) {
        std::map<int64_t, int64_t> per_group;
        for (int64_t x = u * experts_per_unit; x < (u + 1) * experts_per_unit; ++x) {
            ++per_group[x / experts_per_group];
        }
        std::vector<int64_t> counts;
        for (const auto& [g, c] : per_group) counts.push_back(c);
        auto it = cache.find(counts);
        if (it == cache.end()) it = cache.emplace(counts, miss_probability(counts, s)).first;
        hit += 1 - it->second;
    }
    return hit;
}

}  // namespace

RoutingFanout expected_fanout(const RoutingShape& s) {
    MT_CHECK(s.num_experts >= 1 && s.num_groups >= 1 && s.num_experts % s.num_groups == 0,
             "[sim] routing: {} groups do not divide {} experts", s.num_groups, s.num_experts);
    MT_CHECK(s.topk_group >= 1 && s.topk_group <= s.num_groups,
             "[sim] routing: topk_group {} must be in [1, {} groups]", s.topk_group, s.num_groups);
    MT_CHECK(s.topk >= 1 && s.topk <= s.topk_group * (s.num_experts / s.num_groups),
             "[sim] routing: top-{} is more than the {} experts of {} groups", s.topk,
             s.topk_group * (s.num_experts / s.num_groups), s.topk_group);
    MT_CHECK(s.ep >= 1 && s.num_experts % s.ep == 0, "[sim] routing: ep {} does not divide {}",
             s.ep, s.num_experts);
    MT_CHECK(s.ep_ranks_per_domain >= 1 && s.ep % s.ep_ranks_per_domain == 0,
             "[sim] routing: {} EP ranks per domain do not divide ep {}", s.ep_ranks_per_domain,
             s.ep);
    RoutingFanout f;
    const int64_t domains = s.ep / s.ep_ranks_per_domain;
    f.distinct_ranks = expected_units_hit(s.ep, s);
    f.distinct_domains = expected_units_hit(domains, s);
    f.remote_ranks = f.distinct_ranks * static_cast<double>(s.ep - 1) / static_cast<double>(s.ep);
    f.remote_domains =
        f.distinct_domains * static_cast<double>(domains - 1) / static_cast<double>(domains);
    return f;
}

parallel::DispatchFanout expected_dispatch_fanout(const RoutingShape& s) {
    const RoutingFanout f = expected_fanout(s);
    const auto n = static_cast<double>(s.ep);
    const auto L = static_cast<double>(s.ep_ranks_per_domain);
    const double G = n / L;
    parallel::DispatchFanout d;
    d.own_domain_ranks = f.distinct_ranks * (L - 1) / n;
    d.other_domain_ranks = f.distinct_ranks * (n - L) / n;
    d.other_domains = f.distinct_domains * (G - 1) / G;
    d.other_domain_landings = f.distinct_ranks * (G - 1) / n;
    return d;
}

}  // namespace moetron::sim
