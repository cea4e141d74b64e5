// Expert placement with redundant slots (parallel/expert_placement.h): pure functions, no MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/parallel/expert_placement.h"

namespace moetron::parallel {
namespace {

PlacementShape shape_of(int64_t experts, int64_t redundant, int64_t ep, int64_t domains = 1,
                        int64_t groups = 1) {
    return {experts, experts + redundant, ep, domains, groups};
}

// Every slot holds a valid expert, every expert at least one slot, every rank its share.
void expect_valid(const ExpertPlacement& p) {
    ASSERT_EQ(static_cast<int64_t>(p.slot_expert.size()), p.shape.num_slots);
    for (int64_t e = 0; e < p.shape.num_experts; ++e) {
        EXPECT_GE(p.replicas(e), 1) << "expert " << e;
        for (int32_t s : p.slots_of(e)) EXPECT_EQ(p.slot_expert[static_cast<size_t>(s)], e);
    }
}

TEST(ExpertPlacement, OneSpareSlotPerRankBalancesASkewedLoad) {
    // Two hot experts on rank 0 of the contiguous split: it carries 150 of 200.
    const std::vector<double> loads = {100, 50, 10, 10, 10, 10, 5, 5};
    const ExpertPlacement contiguous = initial_placement(shape_of(8, 0, 4));
    EXPECT_DOUBLE_EQ(rank_imbalance(contiguous, loads), 3.0);
    const ExpertPlacement balanced = balanced_placement(loads, shape_of(8, 4, 4));
    expect_valid(balanced);
    EXPECT_LE(rank_imbalance(balanced, loads), 1.10);
    EXPECT_EQ(balanced.replicas(0), 4);  // the hottest expert gets the most replicas
    EXPECT_EQ(balanced.replicas(1), 2);
    // Its four replicas sit on four different ranks.
    std::vector<int64_t> ranks;
    for (int32_t s : balanced.slots_of(0)) ranks.push_back(balanced.rank_of_slot(s));
    std::sort(ranks.begin(), ranks.end());
    EXPECT_EQ(ranks, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(ExpertPlacement, EveryExpertKeepsASlotWhateverItsLoad) {
    std::vector<double> loads(16, 0.0);
    loads[3] = 1000;  // one expert takes everything; the others still need a slot
    const ExpertPlacement p = balanced_placement(loads, shape_of(16, 8, 8));
    expect_valid(p);
    EXPECT_EQ(p.replicas(3), 9);
    const ExpertPlacement zeros =
        balanced_placement(std::vector<double>(16, 0.0), shape_of(16, 8, 8));
    expect_valid(zeros);
    EXPECT_DOUBLE_EQ(rank_imbalance(zeros, std::vector<double>(16, 0.0)), 1.0);
}

TEST(ExpertPlacement, IsDeterministic) {
    const std::vector<double> loads = {3, 9, 1, 1, 7, 2, 2, 9, 4, 4, 4, 4, 0, 5, 6, 6};
    const PlacementShape shape = shape_of(16, 4, 4, 2, 4);
    const ExpertPlacement a = balanced_placement(loads, shape);
    const ExpertPlacement b = balanced_placement(loads, shape);
    EXPECT_EQ(a.slot_expert, b.slot_expert);
    EXPECT_EQ(a.replica_slots, b.replica_slots);
    EXPECT_EQ(initial_placement(shape).slot_expert, initial_placement(shape).slot_expert);
    // Rebuilding from the slots (as a checkpoint does) gives the same index.
    const ExpertPlacement c = placement_from_slots(shape, a.slot_expert);
    EXPECT_EQ(c.replica_first, a.replica_first);
    EXPECT_EQ(c.replica_slots, a.replica_slots);
}

TEST(ExpertPlacement, WithoutRedundantSlotsTheInitialPlacementIsTheContiguousSplit) {
    const ExpertPlacement p = initial_placement(shape_of(8, 0, 4));
    EXPECT_EQ(p.slot_expert, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(ExpertPlacement, HierarchicalKeepsAGroupsReplicasInOneDomain) {
    // 16 experts in 4 groups of 4, 8 ranks in 2 domains, 8 spare slots; group 3 is hot.
    std::vector<double> loads(16, 1.0);
    for (int e = 12; e < 16; ++e) loads[static_cast<size_t>(e)] = 20;
    const PlacementShape shape = shape_of(16, 8, 8, 2, 4);
    ASSERT_TRUE(shape.hierarchical());
    const ExpertPlacement p = balanced_placement(loads, shape);
    expect_valid(p);
    std::vector<int64_t> groups_in_domain(2, 0);
    for (int64_t g = 0; g < 4; ++g) {
        const int64_t domain = p.rank_of_slot(p.slots_of(g * 4)[0]) / shape.ranks_per_domain();
        ++groups_in_domain[static_cast<size_t>(domain)];
        for (int64_t e = g * 4; e < g * 4 + 4; ++e)
            for (int32_t s : p.slots_of(e))
                EXPECT_EQ(p.rank_of_slot(s) / shape.ranks_per_domain(), domain)
                    << "expert " << e << " of group " << g << " has a replica in another domain";
    }
    EXPECT_EQ(groups_in_domain, (std::vector<int64_t>{2, 2}));
    // The hot group's domain spends its four spare slots on the four hot experts; its cold
    // partner group (the lightest one left, group 2) gets none.
    for (int64_t e = 12; e < 16; ++e) EXPECT_EQ(p.replicas(e), 2) << "expert " << e;
    for (int64_t e = 8; e < 12; ++e) EXPECT_EQ(p.replicas(e), 1) << "expert " << e;
    EXPECT_EQ(p.rank_of_slot(p.slots_of(8)[0]) / 4, p.rank_of_slot(p.slots_of(12)[0]) / 4);
}

TEST(ExpertPlacement, ReplicaChoicePrefersTheOwnDomainAndSpreadsTheTokens) {
    // Expert 0 hot: replicas on several ranks of both domains (global policy: one group).
    std::vector<double> loads(8, 1.0);
    loads[0] = 40;
    const PlacementShape shape = shape_of(8, 8, 4, 2, 1);
    const ExpertPlacement p =
        placement_from_slots(shape, balanced_placement(loads, shape).slot_expert);
    ASSERT_GE(p.replicas(0), 4);
    for (int64_t source = 0; source < 4; ++source) {
        const int64_t domain = source / 2;
        std::vector<int64_t> picks(static_cast<size_t>(shape.num_slots), 0);
        for (int64_t t = 0; t < 1000; ++t) {
            const int32_t s = choose_replica(p, 0, source, t);
            EXPECT_EQ(p.slot_expert[static_cast<size_t>(s)], 0);
            EXPECT_EQ(p.rank_of_slot(s) / 2, domain) << "a replica exists in the own domain";
            EXPECT_EQ(s, choose_replica(p, 0, source, t));  // deterministic
            ++picks[static_cast<size_t>(s)];
        }
        // Even shares (placement_from_slots without shares): spread evenly over the own
        // domain's replicas.
        int64_t lo = 1000, hi = 0;
        for (int32_t s : p.slots_of(0))
            if (p.rank_of_slot(s) / 2 == domain) {
                lo = std::min(lo, picks[static_cast<size_t>(s)]);
                hi = std::max(hi, picks[static_cast<size_t>(s)]);
            }
        EXPECT_LE(hi - lo, 2);
    }
}

// Loads where an even split over the replicas cannot balance the ranks: with four ranks of three
// slots, the hot experts' replicas share ranks with unsplittable ones.
const std::vector<double> kUneven = {957, 465, 480, 320, 243, 217, 85, 127};

TEST(ExpertPlacement, ReplicaSharesEvenOutWhatAnEvenSplitCannot) {
    const PlacementShape shape = shape_of(8, 4, 4);
    const ExpertPlacement p = balanced_placement(kUneven, shape);
    expect_valid(p);
    const ExpertPlacement even = placement_from_slots(shape, p.slot_expert);
    EXPECT_GT(rank_imbalance(even, kUneven), 1.05);  // the same slots, split evenly
    EXPECT_LE(rank_imbalance(p, kUneven), 1.01);
    for (int64_t e = 0; e < shape.num_experts; ++e) {
        int64_t sum = 0;
        for (int32_t s : p.slots_of(e)) sum += p.slot_share[static_cast<size_t>(s)];
        EXPECT_EQ(sum, kShareUnits) << "expert " << e;
    }
    // The shares travel through placement_from_slots (a checkpoint) unchanged.
    EXPECT_EQ(placement_from_slots(shape, p.slot_expert, p.slot_share), p);
    EXPECT_THROW(
        placement_from_slots(shape, p.slot_expert, std::vector<int32_t>(p.slot_share.size(), 1)),
        Error);
}

TEST(ExpertPlacement, ReplicaChoiceFollowsTheShares) {
    const PlacementShape shape = shape_of(8, 4, 4);
    const ExpertPlacement p = balanced_placement(kUneven, shape);
    // Tokens of every source rank and expert, as the dispatch picks them: each replica serves its
    // share of them (to a few tokens: the golden-ratio sequence has no runs).
    constexpr int64_t kTokens = 4000;
    for (int32_t e = 0; e < shape.num_experts; ++e) {
        if (p.replicas(e) < 2) continue;
        std::vector<int64_t> picks(static_cast<size_t>(shape.num_slots), 0);
        for (int64_t source = 0; source < shape.ep_size; ++source)
            for (int64_t t = 0; t < kTokens; ++t)
                ++picks[static_cast<size_t>(choose_replica(p, e, source, t))];
        for (int32_t s : p.slots_of(e)) {
            const double want = static_cast<double>(shape.ep_size * kTokens) *
                                p.slot_share[static_cast<size_t>(s)] / kShareUnits;
            EXPECT_NEAR(static_cast<double>(picks[static_cast<size_t>(s)]), want, 8.0)
                << "expert " << e << " slot " << s;
        }
    }
}

TEST(ExpertPlacement, KeepingSlotsInPlaceMovesOnlyWhatChangesRank) {
    const PlacementShape shape = shape_of(8, 4, 4);
    const ExpertPlacement before = balanced_placement(kUneven, shape);
    std::vector<double> shifted = kUneven;
    std::swap(shifted[0], shifted[5]);  // the hottest expert cools down, another heats up
    const ExpertPlacement balanced = balanced_placement(shifted, shape);
    const ExpertPlacement kept = keep_slots_in_place(before, balanced);
    expect_valid(kept);
    auto moved = [&](const ExpertPlacement& after) {
        int64_t n = 0;
        for (size_t s = 0; s < after.slot_expert.size(); ++s)
            n += after.slot_expert[s] != before.slot_expert[s];
        return n;
    };
    // Each rank holds the same experts as in the balanced placement.
    for (int64_t rank = 0; rank < shape.ep_size; ++rank) {
        auto experts_of = [&](const ExpertPlacement& p) {
            std::vector<int32_t> held(p.slot_expert.begin() + rank * 3,
                                      p.slot_expert.begin() + rank * 3 + 3);
            std::sort(held.begin(), held.end());
            return held;
        };
        EXPECT_EQ(experts_of(kept), experts_of(balanced)) << "rank " << rank;
    }
    EXPECT_LT(moved(kept), moved(balanced));
    // An expert that stays on its rank stays in its slot.
    for (size_t s = 0; s < kept.slot_expert.size(); ++s) {
        const int64_t rank = static_cast<int64_t>(s) / 3;
        const int32_t e = before.slot_expert[s];
        bool still_on_rank = false;
        for (int64_t i = rank * 3; i < rank * 3 + 3; ++i)
            still_on_rank |= balanced.slot_expert[static_cast<size_t>(i)] == e;
        if (still_on_rank) {
            EXPECT_EQ(kept.slot_expert[s], e) << "slot " << s;
        }
    }
}

TEST(ExpertPlacement, RedundantSlotsThatDoNotSplitOverTheRanksAreRefusedWithAReason) {
    try {
        initial_placement(shape_of(8, 3, 4));
        ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find("multiple of 4"), std::string::npos) << e.what();
    }
    EXPECT_THROW(initial_placement(shape_of(8, -1, 4)), UserError);
    // A slot table without some expert (e.g. a corrupt checkpoint) is an internal error.
    EXPECT_THROW(placement_from_slots(shape_of(4, 0, 2), {0, 1, 2, 2}), Error);
}

}  // namespace
}  // namespace moetron::parallel
