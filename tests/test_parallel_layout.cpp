// Layout strings, topology validation and group membership: pure functions, no MPI.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/model/layout_fit.h"
#include "moetron/parallel/layout.h"
#include "moetron/parallel/local_communicator.h"
#include "moetron/parallel/topology.h"

namespace moetron::parallel {
namespace {

using Ranks = std::vector<int>;

// Runs f, which must throw moetron::Error, and checks that the message contains `needle`.
template <class F>
void expect_error_containing(F&& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one containing \"" << needle << "\"";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "message: " << e.what() << "\nexpected to contain: " << needle;
    }
}

TEST(ParallelLayout, ParsesTokensInAnyOrder) {
    const Layout a = parse_layout("tp2.ep4");
    EXPECT_EQ(a.tp, 2);
    EXPECT_EQ(a.ep, 4);
    EXPECT_EQ(a.pp, 1);
    EXPECT_EQ(a.cp, 1);
    EXPECT_EQ(a.dp, 0);  // unresolved: what remains of the world
    const Layout b = parse_layout("dp3.ep4.tp2.pp1.cp1");
    EXPECT_EQ(b.tp, 2);
    EXPECT_EQ(b.ep, 4);
    EXPECT_EQ(b.dp, 3);
    const Layout none = parse_layout("");
    EXPECT_EQ(none.tp, 1);
    EXPECT_EQ(none.ep, 1);
    EXPECT_EQ(none.dp, 0);
    EXPECT_EQ(parse_layout("ep16").str(), "tp1.pp1.vpp1.ep16.cp1");
    EXPECT_EQ(b.str(), "tp2.pp1.vpp1.ep4.cp1.dp3");
    EXPECT_EQ(parse_layout("vpp4.pp2").vpp, 4);
}

TEST(ParallelLayout, MalformedStringsAreErrorsNamingTheToken) {
    expect_error_containing([] { parse_layout("tp2.xx4"); }, "unknown dimension 'xx'");
    expect_error_containing([] { parse_layout("tp2.ep2.tp4"); }, "'tp' appears twice");
    expect_error_containing([] { parse_layout("tp"); }, "token 'tp' of layout 'tp' has no size");
    expect_error_containing([] { parse_layout("tp0"); }, "not a positive integer");
    expect_error_containing([] { parse_layout("tp2x"); }, "size '2x'");
    expect_error_containing([] { parse_layout("tp-2"); }, "unknown dimension 'tp-'");
    expect_error_containing([] { parse_layout("tp2..ep2"); }, "empty token");
    expect_error_containing([] { parse_layout("tp2."); }, "empty token");
    expect_error_containing([] { parse_layout("TP2"); }, "unknown dimension 'TP'");
    expect_error_containing([] { parse_layout("tp99999999999"); }, "not a positive integer");
}

TEST(ParallelTopology, ResolvesDataParallelAndExpertDataParallel) {
    const Topology t = make_topology(parse_layout("tp2.ep4"), 8, 4);
    EXPECT_EQ(t.dp, 4);
    EXPECT_EQ(t.edp, 2);
    EXPECT_EQ(t.num_domains(), 2);
    // The layout spelled as Layout::str spells it (and parse_layout reads back), then the world.
    EXPECT_EQ(t.str(), "tp2.pp1.vpp1.ep4.cp1.dp4 (world 8 in 2 domains of 4, edp2)");
    EXPECT_EQ(t.layout().str(), parse_layout("tp2.ep4", 8).str());
    EXPECT_EQ(parse_layout(t.layout().str(), 8).str(), t.layout().str());
    EXPECT_EQ(make_topology(parse_layout("pp2.vpp2"), 2, 0).str(),
              "tp1.pp2.vpp2.ep1.cp1.dp1 (world 2 in 1 domain of 2, edp1)");
    EXPECT_EQ(make_topology(parse_layout(""), 6, 0).domain_size, 6);  // 0: one domain
}

TEST(ParallelTopology, ImpossibleLayoutsSayWhy) {
    expect_error_containing([] { make_topology(parse_layout("tp4"), 6, 0); },
                            "world of 6 ranks is not divisible by tp*cp*pp = 4*1*1 = 4");
    expect_error_containing([] { make_topology(parse_layout("ep4"), 6, 0); },
                            "expert side: the world of 6 ranks is not divisible by ep*pp");
    expect_error_containing([] { make_topology(parse_layout("tp2.dp3"), 8, 0); },
                            "dp3 needs dp*tp*cp*pp = 6 ranks, but world/(tp*cp*pp) = 4; write dp4");
    expect_error_containing([] { make_topology(parse_layout("dp3.ep2"), 8, 0); },
                            "dp3 needs dp*tp*cp*pp = 3 ranks, but world/(tp*cp*pp) = 8; write dp8");
    expect_error_containing([] { make_topology(parse_layout(""), 8, 3); },
                            "domain_size 3 does not divide the world of 8 ranks");
    EXPECT_EQ(make_topology(parse_layout("pp2"), 8, 0).pp, 2);
    EXPECT_EQ(make_topology(parse_layout("pp2.vpp2"), 8, 0).vpp, 2);
    expect_error_containing([] { make_topology(parse_layout("vpp2"), 8, 0); },
                            "vpp 2 needs pp > 1");
    expect_error_containing([] { make_topology(parse_layout("cp2"), 8, 0); },
                            "context parallelism (cp 2) is not supported yet");
    expect_error_containing([] { make_topology(parse_layout("tp4"), 12, 6); },
                            "tp 4 with domain_size 6");
    expect_error_containing([] { make_topology(parse_layout("ep3"), 12, 2); },
                            "ep 3 with domain_size 2");
    expect_error_containing([] { make_topology(parse_layout(""), 0, 0); }, "world size");
    // A group spanning whole domains is fine.
    EXPECT_NO_THROW(make_topology(parse_layout("ep4"), 8, 2));
}

TEST(ParallelTopology, ModelChecks) {
    ModelConfig model;
    model.name = "toy";
    model.num_attention_heads = 6;
    model.n_routed_experts = 8;
    EXPECT_NO_THROW(validate_topology_for_model(make_topology(parse_layout("tp2.ep4"), 8), model));
    expect_error_containing(
        [&] { validate_topology_for_model(make_topology(parse_layout("tp4"), 8), model); },
        "tp 4 does not divide the 6 attention heads of model 'toy'");
    model.n_routed_experts = 6;
    expect_error_containing(
        [&] { validate_topology_for_model(make_topology(parse_layout("ep4"), 8), model); },
        "ep 4 does not divide the 6 routed experts");
    model.n_routed_experts = 0;
    expect_error_containing(
        [&] { validate_topology_for_model(make_topology(parse_layout("ep2"), 8), model); },
        "needs routed experts");
}

// Tensor parallelism splits the vocabulary, the dense MLP and the shared experts too: each size
// that tp must divide is named with its numbers.
TEST(ParallelTopology, TensorParallelNamesWhatTpMustDivide) {
    ModelConfig model;
    model.name = "toy";
    model.num_attention_heads = 8;
    model.vocab_size = 256;
    model.intermediate_size = 128;
    model.n_routed_experts = 8;
    model.n_shared_experts = 1;
    model.moe_intermediate_size = 32;
    const Topology tp4 = make_topology(parse_layout("tp4"), 8);
    EXPECT_NO_THROW(validate_topology_for_model(tp4, model));
    model.vocab_size = 250;
    expect_error_containing([&] { validate_topology_for_model(tp4, model); },
                            "tp 4 does not divide vocab_size 250");
    model.vocab_size = 256;
    model.intermediate_size = 130;
    expect_error_containing([&] { validate_topology_for_model(tp4, model); },
                            "tp 4 does not divide intermediate_size 130");
    model.intermediate_size = 128;
    model.moe_intermediate_size = 30;
    expect_error_containing([&] { validate_topology_for_model(tp4, model); },
                            "n_shared_experts 1 x moe_intermediate_size 30 = 30");
}

Ranks members(const Topology& t, GroupKind kind, int rank) {
    return group_of(t, kind, rank).ranks;
}

TEST(ParallelTopology, Tp2Ep2OnFourRanksWithDomainsOfTwo) {
    const Topology t = make_topology(parse_layout("tp2.ep2"), 4, 2);
    EXPECT_EQ(t.dp, 2);
    EXPECT_EQ(t.edp, 2);
    EXPECT_EQ(members(t, GroupKind::tp, 0), (Ranks{0, 1}));
    EXPECT_EQ(members(t, GroupKind::tp, 3), (Ranks{2, 3}));
    EXPECT_EQ(members(t, GroupKind::dp, 1), (Ranks{1, 3}));
    EXPECT_EQ(members(t, GroupKind::ep, 2), (Ranks{2, 3}));
    EXPECT_EQ(members(t, GroupKind::edp, 2), (Ranks{0, 2}));
    EXPECT_EQ(members(t, GroupKind::rail, 1), (Ranks{1, 3}));
    EXPECT_EQ(members(t, GroupKind::rail, 2), (Ranks{0, 2}));
    EXPECT_EQ(members(t, GroupKind::cp, 2), (Ranks{2}));
    EXPECT_EQ(members(t, GroupKind::pp, 2), (Ranks{2}));
    const GroupMembership g = group_of(t, GroupKind::dp, 3);
    EXPECT_EQ(g.index, 1);
    EXPECT_EQ(g.color, 1);
}

// The two-tier dispatch's groups inside each EP group: 16 ranks, domains of 4, ep 8 (two EP
// groups, each over two domains).
TEST(ParallelTopology, EpDomainAndEpRailSplitEachEpGroup) {
    const Topology t = make_topology(parse_layout("ep8"), 16, 4);
    EXPECT_EQ(members(t, GroupKind::ep, 9), (Ranks{8, 9, 10, 11, 12, 13, 14, 15}));
    EXPECT_EQ(members(t, GroupKind::ep_domain, 9), (Ranks{8, 9, 10, 11}));
    EXPECT_EQ(members(t, GroupKind::ep_rail, 9), (Ranks{9, 13}));
    EXPECT_EQ(members(t, GroupKind::rail, 9), (Ranks{1, 5, 9, 13}));  // the job's rail
    const GroupMembership rail = group_of(t, GroupKind::ep_rail, 13);
    const GroupMembership domain = group_of(t, GroupKind::ep_domain, 13);
    // EP rank = rail index * ranks per domain + domain index.
    EXPECT_EQ(rail.index * 4 + domain.index, group_of(t, GroupKind::ep, 13).index);
    // An EP group inside one domain: ep_domain is the EP group, ep_rail the rank alone.
    const Topology small = make_topology(parse_layout("ep2"), 8, 4);
    EXPECT_EQ(members(small, GroupKind::ep_domain, 5), (Ranks{4, 5}));
    EXPECT_EQ(members(small, GroupKind::ep_rail, 5), (Ranks{5}));
}

TEST(ParallelTopology, Dp2Ep2FoldsExpertsIndependentlyOfData) {
    const Topology t = make_topology(parse_layout("dp2.ep2"), 2, 2);
    EXPECT_EQ(t.tp, 1);
    EXPECT_EQ(members(t, GroupKind::dp, 0), (Ranks{0, 1}));
    EXPECT_EQ(members(t, GroupKind::ep, 1), (Ranks{0, 1}));
    EXPECT_EQ(members(t, GroupKind::edp, 1), (Ranks{1}));
    EXPECT_EQ(members(t, GroupKind::tp, 1), (Ranks{1}));

    // Four ranks, dp4 on the attention side, ep2 x edp2 on the expert side: dp counts the
    // attention side, as Megatron-LM does, so dp4 may be written or left out.
    for (const char* text : {"ep2", "dp4.ep2"}) {
        SCOPED_TRACE(text);
        const Topology u = make_topology(parse_layout(text), 4, 2);
        EXPECT_EQ(u.dp, 4);
        EXPECT_EQ(u.edp, 2);
        EXPECT_EQ(members(u, GroupKind::dp, 2), (Ranks{0, 1, 2, 3}));
        EXPECT_EQ(members(u, GroupKind::ep, 2), (Ranks{2, 3}));
        EXPECT_EQ(members(u, GroupKind::edp, 3), (Ranks{1, 3}));
    }
}

// "dp2.ep2" on 4 ranks once counted the expert side's replicas; now one meaning of dp, and the
// other spelling says what to write instead.
TEST(ParallelTopology, DpCountingTheExpertSideSaysWhatToWrite) {
    expect_error_containing([] { make_topology(parse_layout("dp2.ep2"), 4, 2); },
                            "dp2 is the expert side's replicas (edp = world/(ep*pp) = 2), which "
                            "follows from ep. Write dp4 or leave dp out");
    // The cluster model reads the same string the same way.
    expect_error_containing([] { parse_layout("dp2.ep2", 4); }, "Write dp4 or leave dp out");
    // Sizes whose product does not fit 64 bits are refused, not wrapped.
    expect_error_containing([] { parse_layout("tp2000000000.cp2000000000.pp2000000000", 8); },
                            "the sizes multiply to more than any world");
    EXPECT_EQ(parse_layout("dp4.ep2", 4).edp(), 2);
}

TEST(ParallelTopology, Ep4SpansTwoDomainsOfTwo) {
    const Topology t = make_topology(parse_layout("ep4"), 4, 2);
    for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(members(t, GroupKind::ep, r), (Ranks{0, 1, 2, 3}));
        EXPECT_EQ(group_of(t, GroupKind::ep, r).index, r);
        EXPECT_EQ(members(t, GroupKind::edp, r), (Ranks{r}));
        EXPECT_EQ(members(t, GroupKind::dp, r), (Ranks{0, 1, 2, 3}));
        EXPECT_EQ(members(t, GroupKind::rail, r), (Ranks{r % 2, r % 2 + 2}));
        const RankCoordinates c = coordinates_of(t, r);
        EXPECT_EQ(c.domain, r / 2);
        EXPECT_EQ(c.local, r % 2);
    }
}

// Every group of every kind partitions the world: each rank in exactly one group, colors equal
// within a group and distinct between groups, indices 0..size-1.
TEST(ParallelTopology, GroupsPartitionTheWorld) {
    for (const char* text : {"tp2.ep4", "tp4.ep2", "ep8", "tp2", "", "tp8.ep8", "dp4.tp2.ep2"}) {
        const Topology t = make_topology(parse_layout(text), 8, 4);
        for (GroupKind kind : kAllGroupKinds) {
            std::vector<int> color_of(8, -1);
            for (int r = 0; r < 8; ++r) {
                const GroupMembership g = group_of(t, kind, r);
                ASSERT_LT(g.index, static_cast<int>(g.ranks.size()));
                EXPECT_EQ(g.ranks[g.index], r) << text << " " << group_kind_name(kind);
                for (int m : g.ranks) {
                    const GroupMembership other = group_of(t, kind, m);
                    EXPECT_EQ(other.ranks, g.ranks) << text << " " << group_kind_name(kind);
                    EXPECT_EQ(other.color, g.color);
                }
                color_of[r] = g.color;
            }
            for (int a = 0; a < 8; ++a)
                for (int b = 0; b < 8; ++b) {
                    const bool same = group_of(t, kind, a).ranks == group_of(t, kind, b).ranks;
                    EXPECT_EQ(same, color_of[a] == color_of[b]);
                }
        }
    }
}

TEST(ParallelTopology, BuildGroupsOnAWorldOfOne) {
    LocalCommunicator world;
    const Topology t = make_topology(parse_layout(""), 1, 0);
    ParallelGroups groups = build_groups(world, t);
    for (GroupKind kind : kAllGroupKinds) {
        EXPECT_EQ(groups.get(kind).size(), 1);
        EXPECT_EQ(groups.get(kind).name(), group_kind_name(kind));
    }
    expect_error_containing([&] { build_groups(world, make_topology(parse_layout("ep2"), 2, 0)); },
                            "topology is for 2 ranks but group 'world' has 1");
}

}  // namespace
}  // namespace moetron::parallel
