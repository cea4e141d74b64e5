// Two-tier dispatch under mpirun with emulated domains: the same round trip as the flat test
// (dispatch_reference.h), checked against the reference and against the flat dispatch on the
// same routing: expert inputs bit-for-bit, combine within fp tolerance; the bytes per tier against
// the analytic count. Every domain split of the world into two or more domains: 2 domains on 2
// ranks, 4 domains of 1 and 2 domains of 2 on 4 ranks.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "moetron/kernels/cpu/router.h"
#include "mpi/dispatch_reference.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

using parallel::Communicator;
using parallel::TwoTierBuffer;
using parallel::TwoTierLayout;

// The EP group (the world here) split into emulated domains of L consecutive ranks.
struct EmulatedDomains {
    int64_t domain_size = 0;
    std::unique_ptr<Communicator> rail, domain;
    parallel::TwoTierGroups groups() const { return {rail.get(), domain.get()}; }
};

EmulatedDomains split_into_domains(Communicator& world, int64_t domain_size) {
    const int L = static_cast<int>(domain_size), r = world.rank();
    EmulatedDomains d;
    d.domain_size = domain_size;
    d.rail = world.split(r % L, r / L, "ep_rail");
    d.domain = world.split(r / L, r % L, "ep_domain");
    return d;
}

// Domain sizes that split the world into two or more whole domains.
std::vector<int64_t> two_tier_domain_sizes(int world) {
    std::vector<int64_t> sizes;
    for (int64_t L = 1; L < world; ++L)
        if (world % L == 0) sizes.push_back(L);
    return sizes;
}

void run_case(DispatchCase c, const EmulatedDomains& domains) {
    Communicator& ep = mpi_world();
    c.domain_size = domains.domain_size;
    c.name += "/domain_size_" + std::to_string(c.domain_size);
    const parallel::DispatchConfig cfg = config_for(c);
    TwoTierBuffer buffer(cfg, ep.size(), cpu_backend());
    TwoTierLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
    const DispatchResult two_tier =
        run_two_tier(c, ep.rank(), ep.size(), layout, buffer, domains.groups());
    expect_matches_reference(two_tier, reference_result(c, ep.rank(), ep.size()),
                             analytic_bytes(c, ep.rank(), ep.size(), true), c.name);

    parallel::DispatchBuffer flat_buffer(cfg, ep.size(), cpu_backend());
    parallel::DispatchLayout flat_layout(cfg, ep.size(), ep.rank(), cpu_backend());
    const DispatchResult flat = run_dispatch(c, ep, flat_layout, flat_buffer);
    EXPECT_EQ(two_tier.expert_offsets, flat.expert_offsets) << c.name;
    EXPECT_EQ(two_tier.expert_inp, flat.expert_inp) << c.name;
    expect_close(c.name.c_str(), "out vs flat",
                 compare(two_tier.out.data(), flat.out.data(), flat.out.size()), 1e-5);
    expect_close(c.name.c_str(), "dweights vs flat",
                 compare(two_tier.dweights.data(), flat.dweights.data(), flat.dweights.size()),
                 1e-5);
    // A token crosses to a domain once, not once per rank there.
    EXPECT_LE(two_tier.bytes[1].inter_domain, flat.bytes[1].inter_domain) << c.name;
}

void run_on_every_split(const DispatchCase& c) {
    Communicator& ep = mpi_world();
    if (ep.size() < 2) GTEST_SKIP() << "two tiers need two domains, so at least 2 ranks";
    for (int64_t L : two_tier_domain_sizes(ep.size())) {
        const EmulatedDomains domains = split_into_domains(ep, L);
        run_case(c, domains);
    }
}

TEST(MpiDispatchTwoTier, RandomRouting) {
    DispatchCase c;
    c.name = "random";
    c.tokens_per_rank = {13, 5, 9, 1};
    run_on_every_split(c);
}

TEST(MpiDispatchTwoTier, SkewedRoutingWideK) {
    DispatchCase c;
    c.name = "skewed";
    c.routing = Routing::skewed;
    c.num_experts = 16;
    c.top_k = 6;
    c.hidden = 24;
    c.tokens_per_rank = {11, 17};
    run_on_every_split(c);
}

TEST(MpiDispatchTwoTier, AdversarialRoutings) {
    for (Routing routing : {Routing::first_experts, Routing::last_experts, Routing::skip_rank_1,
                            Routing::skip_domain_1, Routing::self_only}) {
        DispatchCase c;
        c.name = "adversarial_" + std::to_string(static_cast<int>(routing));
        c.routing = routing;
        c.top_k = routing == Routing::first_experts ? 1 : 2;
        c.tokens_per_rank = {6, 11, 3};
        run_on_every_split(c);
    }
}

TEST(MpiDispatchTwoTier, RanksWithoutTokens) {
    DispatchCase c;
    c.name = "zero_tokens_on_rank_1";
    c.tokens_per_rank = {8, 0, 3, 0};
    run_on_every_split(c);
    c.name = "no_tokens";
    c.tokens_per_rank = {0};
    run_on_every_split(c);
}

TEST(MpiDispatchTwoTier, LayoutAndBufferReusedAcrossRoutings) {
    Communicator& ep = mpi_world();
    if (ep.size() < 2) GTEST_SKIP() << "two tiers need two domains, so at least 2 ranks";
    DispatchCase first;
    first.name = "reuse_first";
    first.tokens_per_rank = {12, 3};
    DispatchCase second = first;
    second.name = "reuse_second";
    second.seed = 2;
    second.routing = Routing::last_experts;
    second.tokens_per_rank = {2, 12};
    const EmulatedDomains domains = split_into_domains(ep, ep.size() / 2);
    first.domain_size = second.domain_size = domains.domain_size;
    const parallel::DispatchConfig cfg = config_for(first);
    TwoTierBuffer buffer(cfg, ep.size(), cpu_backend());
    TwoTierLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
    for (const DispatchCase* c : {&first, &second, &first}) {
        const DispatchResult got =
            run_two_tier(*c, ep.rank(), ep.size(), layout, buffer, domains.groups());
        expect_matches_reference(got, reference_result(*c, ep.rank(), ep.size()),
                                 analytic_bytes(*c, ep.rank(), ep.size(), true), c->name);
    }
}

// Group-limited routing with the router's groups mapped to domains (n_group = G, topk_group = 1):
// every token reaches one domain, so it crosses the rail at most once.
TEST(MpiDispatchTwoTier, DomainLimitedRoutingReachesAtMostTopkGroupDomains) {
    Communicator& ep = mpi_world();
    if (ep.size() < 2) GTEST_SKIP() << "two tiers need two domains, so at least 2 ranks";
    const EmulatedDomains domains = split_into_domains(ep, 1);  // G = ep domains
    const int64_t N = 32, E = 8, K = 3, G = ep.size();
    std::vector<float> logits = random_floats(static_cast<size_t>(N * E), 77 + ep.rank());
    std::vector<float> scores(static_cast<size_t>(N * E)), w(static_cast<size_t>(N * K));
    std::vector<int32_t> ids(static_cast<size_t>(N * K));
    const int64_t experts_per_group = E / G;
    const int64_t topk_groups = (K + experts_per_group - 1) / experts_per_group;  // K must fit
    cpu::router_forward(ids.data(), w.data(), scores.data(), logits.data(), nullptr,
                        {N, E, K, G, topk_groups, 1.0f, true});
    parallel::DispatchConfig cfg;
    cfg.num_experts = E;
    cfg.top_k = K;
    cfg.hidden = 4;
    cfg.max_tokens = N;
    cfg.domain_size = 1;
    TwoTierBuffer buffer(cfg, ep.size(), cpu_backend());
    TwoTierLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
    parallel::two_tier_layout(layout, ids.data(), w.data(), N, buffer, domains.groups());
    EXPECT_LE(layout.spread().domain_max, topk_groups);
    EXPECT_LE(layout.spread().domain_sum, N * topk_groups);
    // Route records cross the rail once per (token, other domain) at most.
    const uint64_t record_bytes = (2 * K + 1) * 4, count_bytes = 4 * (G - 1);
    EXPECT_LE(buffer.bytes_sent().inter_domain,
              static_cast<uint64_t>(N * topk_groups) * record_bytes + count_bytes);
}

TEST(MpiDispatchTwoTier, BadDomainSplitsAreErrors) {
    parallel::DispatchConfig cfg;
    cfg.num_experts = 8;
    cfg.top_k = 2;
    cfg.hidden = 4;
    cfg.max_tokens = 4;
    cfg.domain_size = 4;
    try {
        parallel::check_two_tier(cfg, 4);  // one domain: flat is the same thing
        ADD_FAILURE() << "no error for two_tier over one domain";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("one domain"), std::string::npos) << e.what();
    }
    cfg.domain_size = 3;
    try {
        parallel::check_two_tier(cfg, 4);
        ADD_FAILURE() << "no error for domains that do not split the EP group";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not split into whole domains of 3"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace moetron::testing
