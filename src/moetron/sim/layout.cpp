#include "moetron/sim/layout.h"

#include <fmt/format.h>

#include <numeric>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::sim {

int64_t used_gpus_per_domain(const parallel::Layout& l, int64_t domain_gpus) {
    const int64_t block = std::lcm(l.ep, l.tp);
    if (block <= domain_gpus) return (domain_gpus / block) * block;
    // A block larger than a domain is split evenly over the fewest domains that can hold it.
    for (int64_t k = 2; k <= block; ++k) {
        if (block % k == 0 && block / k <= domain_gpus) return block / k;
    }
    return 1;
}

GroupPlacement place_group(int64_t size, int64_t stride, int64_t gpus_per_domain) {
    GroupPlacement g;
    g.size = size;
    int64_t domains = 0;
    int64_t last = -1;
    int64_t max_in_one = 0, run = 0;
    // Ranks are increasing, so equal domains are contiguous in this walk.
    for (int64_t i = 0; i < size; ++i) {
        const int64_t d = (i * stride) / gpus_per_domain;
        if (d != last) {
            ++domains;
            last = d;
            run = 0;
        }
        max_in_one = std::max(max_in_one, ++run);
    }
    g.domains = domains;
    g.ranks_per_domain = max_in_one;
    return g;
}

LayoutPlacement place_layout(const parallel::Layout& l, int64_t domain_gpus) {
    LayoutPlacement p;
    p.gpus_per_domain = used_gpus_per_domain(l, domain_gpus);
    p.num_domains = (l.world_size() + p.gpus_per_domain - 1) / p.gpus_per_domain;
    const int64_t u = p.gpus_per_domain;
    p.tp = place_group(l.tp, 1, u);
    p.cp = place_group(l.cp, l.tp, u);
    p.dp = place_group(l.dp, l.tp * l.cp, u);
    p.ep = place_group(l.ep, 1, u);
    p.edp = place_group(l.edp(), l.ep, u);
    p.pp = place_group(l.pp, l.world_size() / l.pp, u);
    return p;
}

}  // namespace moetron::sim
