// Flat dispatch under mpirun: dispatch -> identity experts scaled by (e + 1) -> combine, and the
// backward of both, against the single-process reference (dispatch_reference.h), on 1, 2 and 4
// ranks, with adversarial routings; the bytes sent per tier against the analytic count.
#include <gtest/gtest.h>

#include "mpi/dispatch_reference.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

using parallel::DispatchBuffer;
using parallel::DispatchLayout;

void run_case(const DispatchCase& c) {
    parallel::Communicator& ep = mpi_world();
    const parallel::DispatchConfig cfg = config_for(c);
    DispatchBuffer buffer(cfg, ep.size(), cpu_backend());
    DispatchLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
    const DispatchResult got = run_dispatch(c, ep, layout, buffer);
    expect_matches_reference(got, reference_result(c, ep.rank(), ep.size()),
                             analytic_bytes(c, ep.rank(), ep.size(), false), c.name);
}

// E = 8 splits over 1, 2 and 4 ranks (El = 8, 4, 2).
TEST(MpiDispatch, RandomRoutingMatchesReference) {
    DispatchCase c;
    c.name = "random";
    c.tokens_per_rank = {13, 5, 9, 1};
    run_case(c);
}

// The same with emulated domains of one rank: every peer is remote, the bytes split accordingly.
TEST(MpiDispatch, RandomRoutingOverDomainsOfOneRank) {
    DispatchCase c;
    c.name = "random_domains_of_1";
    c.tokens_per_rank = {13, 5, 9, 1};
    c.domain_size = 1;
    run_case(c);
    c.name = "skewed_domains_of_2";
    c.routing = Routing::skewed;
    c.domain_size = 2;
    run_case(c);  // one domain on 1 and 2 ranks
}

TEST(MpiDispatch, AllTokensToOneExpert) {
    DispatchCase c;
    c.name = "all_to_expert_0";
    c.top_k = 1;
    c.routing = Routing::first_experts;
    run_case(c);  // ranks other than 0 receive nothing; experts other than 0 receive nothing
}

TEST(MpiDispatch, AllTokensToTheLastRank) {
    DispatchCase c;
    c.name = "all_to_last_rank";
    c.top_k = 2;
    c.routing = Routing::last_experts;
    c.tokens_per_rank = {6, 11};
    run_case(c);
}

TEST(MpiDispatch, RankThatReceivesNothing) {
    DispatchCase c;
    c.name = "skip_rank_1";
    c.routing = Routing::skip_rank_1;
    run_case(c);
}

TEST(MpiDispatch, RankWithZeroTokens) {
    DispatchCase c;
    c.name = "zero_tokens_on_rank_1";
    c.tokens_per_rank = {8, 0, 3, 0};
    run_case(c);
}

TEST(MpiDispatch, NoTokensAnywhere) {
    DispatchCase c;
    c.name = "no_tokens";
    c.tokens_per_rank = {0};
    run_case(c);
}

TEST(MpiDispatch, SelfOnlyRoutingSendsNothingToPeers) {
    DispatchCase c;
    c.name = "self_only";
    c.routing = Routing::self_only;
    run_case(c);  // peer_rows_sent == 0 is part of the comparison
}

TEST(MpiDispatch, TopKEqualsExpertCountAndWideRows) {
    DispatchCase c;
    c.name = "k_equals_e";
    c.num_experts = 4;
    c.top_k = 4;
    c.hidden = 100;
    c.tokens_per_rank = {3, 4};
    run_case(c);
}

TEST(MpiDispatch, LayoutAndBufferReusedAcrossRoutings) {
    parallel::Communicator& ep = mpi_world();
    DispatchCase first;
    first.name = "reuse_first";
    first.tokens_per_rank = {12, 3};
    DispatchCase second = first;
    second.name = "reuse_second";
    second.seed = 2;
    second.routing = Routing::last_experts;
    second.tokens_per_rank = {2, 12};
    const parallel::DispatchConfig cfg = config_for(first);
    DispatchBuffer buffer(cfg, ep.size(), cpu_backend());
    DispatchLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
    for (const DispatchCase* c : {&first, &second, &first}) {
        const DispatchResult got = run_dispatch(*c, ep, layout, buffer);
        expect_matches_reference(got, reference_result(*c, ep.rank(), ep.size()),
                                 analytic_bytes(*c, ep.rank(), ep.size(), false), c->name);
    }
}

// A routing beyond the pair budget is refused by each sending rank on its own, before any
// collective (ExpertDispatcher::plan_rounds splits such a routing into rounds instead).
TEST(MpiDispatch, OverflowingThePairBudgetIsRefusedBeforeAnyCollective) {
    parallel::Communicator& ep = mpi_world();
    DispatchCase c;
    c.routing = Routing::first_experts;  // every copy lands on rank 0
    c.top_k = 1;
    parallel::DispatchConfig cfg = config_for(c);
    cfg.pair_capacity_rows = 3;  // each rank sends 7 rows to rank 0
    DispatchLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
    DispatchBuffer buffer(cfg, ep.size(), cpu_backend());
    EXPECT_EQ(buffer.config().capacity_rows(ep.size()), 3 * ep.size());
    const RankInputs in = make_inputs(c, ep.rank(), ep.size());
    try {
        parallel::dispatch_layout(layout, in.ids.data(), in.weights.data(), in.num_tokens, buffer,
                                  ep);
        ADD_FAILURE() << "no error for a routing beyond the pair budget";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sends 7 rows to EP rank 0, more than the 3 planned"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace moetron::testing
