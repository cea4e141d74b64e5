// Expert placement with redundant experts: which logical expert each physical expert slot holds,
// computed from the measured load of every logical expert (pure functions, no communication).
//
// An EP group of ep ranks holds E + R physical slots, slots_per_rank = (E + R) / ep on each rank
// in order (rank r holds slots [r * slots_per_rank, (r + 1) * slots_per_rank)). Every logical
// expert gets at least one slot; the R spare slots replicate the hottest ones, so that a hot
// expert's tokens split over its replicas and the busiest rank carries less.
//
// The policy (the idea of DeepSeek's open EPLB, written anew here):
//   replicate: give each extra slot to the expert whose load per replica is highest;
//   pack:      place the replicas, heaviest first, on the least loaded rank that still has a free
//              slot (and, when it can, does not already hold a replica of the same expert);
//   share:     split each replicated expert's tokens over its replicas so that the ranks carry
//              even loads (not 1/replicas each: a replica on a rank that is already busy with
//              unsplittable experts takes fewer tokens). Water-filling, expert by expert, repeated:
//              each pass lowers the sum of the squared rank loads, towards the split where no
//              expert could move tokens to a less loaded rank that holds one of its replicas.
// Hierarchical, when the EP group spans several scale-up domains and the router is group-limited
// (n_group divisible by the domains): first the expert groups are packed onto domains (each domain
// the same number of groups, the loads as even as possible), then each domain replicates and packs
// its own experts over its own ranks. So every replica of an expert stays in the domain of its
// group, as domain-limited routing expects (a token reaches at most topk_group groups, hence few
// domains). Otherwise the global policy replicates and packs over all ranks at once.
//
// The dispatch follows the shares (choose_replica), so the placement's prediction (rank_loads) is
// what the ranks receive, up to the step's own deviation from the loads the placement was made for.
//
// Every function is deterministic: ties break on the lowest expert, replica and rank index, so
// every rank computing a placement from the same loads gets the same one.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace moetron::parallel {

// The shape a placement fills.
struct PlacementShape {
    int64_t num_experts = 0;  // E logical experts
    int64_t num_slots = 0;    // E + R physical slots over the EP group
    int64_t ep_size = 1;      // ranks of the EP group
    int64_t num_domains = 1;  // scale-up domains the EP group spans (consecutive ranks each)
    int64_t num_groups = 1;   // expert groups of the group-limited router (n_group)

    int64_t slots_per_rank() const { return num_slots / ep_size; }
    int64_t ranks_per_domain() const { return ep_size / num_domains; }
    // Whether placement keeps each expert group inside one domain (see above).
    bool hierarchical() const { return num_domains > 1 && num_groups % num_domains == 0; }
};

// Throws moetron::UserError when the shape cannot hold a placement: redundant slots that do not
// split evenly over the EP group ("--redundant-experts R: E + R must be a multiple of ep"),
// fewer slots than experts, domains not splitting the ranks.
void check_placement_shape(const PlacementShape& shape);

// The unit of a replica's share: an expert's replicas' shares sum to it.
inline constexpr int32_t kShareUnits = 1 << 16;

struct ExpertPlacement {
    PlacementShape shape;
    std::vector<int32_t> slot_expert;  // (E + R) the logical expert each physical slot holds
    // (E + R) the share of its expert's tokens each slot serves, in kShareUnits (what
    // choose_replica picks by; a single replica holds all of them).
    std::vector<int32_t> slot_share;
    std::vector<int64_t> replica_first;  // (E + 1) expert e's slots: replica_slots[first[e] ..
    std::vector<int32_t> replica_slots;  //          first[e + 1]), ascending
    int64_t replicas(int64_t expert) const {
        return replica_first[static_cast<size_t>(expert) + 1] -
               replica_first[static_cast<size_t>(expert)];
    }
    std::span<const int32_t> slots_of(int64_t expert) const {
        return std::span<const int32_t>(replica_slots)
            .subspan(static_cast<size_t>(replica_first[static_cast<size_t>(expert)]),
                     static_cast<size_t>(replicas(expert)));
    }
    int64_t rank_of_slot(int64_t slot) const { return slot / shape.slots_per_rank(); }
    bool operator==(const ExpertPlacement& other) const {
        return slot_expert == other.slot_expert &&  // the replica index derives from it
               slot_share == other.slot_share;
    }
};

// The placement for these loads (one per logical expert, any non-negative unit: tokens, or a
// moving average of them). Throws as check_placement_shape, and moetron::Error for a load that is
// negative or not finite or a span of the wrong size.
ExpertPlacement balanced_placement(std::span<const double> expert_loads,
                                   const PlacementShape& shape);

// next with each rank's slots reordered so that an expert the rank held in `previous` keeps its
// slot there (the others fill the remaining slots in ascending order), and even shares: the same
// placement for the loads, but a migration from previous moves only what changes rank.
ExpertPlacement keep_slots_in_place(const ExpertPlacement& previous, const ExpertPlacement& next);

// The placement before any load is measured: the one for equal loads. Without redundant slots it
// is the contiguous split (expert e on slot e), the placement of a run without EPLB.
ExpertPlacement initial_placement(const PlacementShape& shape);

// Builds the replica index (replica_first, replica_slots) from shape and slot_expert, with these
// shares (empty: each expert's tokens split evenly over its replicas); throws moetron::Error when
// some expert has no slot, a slot holds no valid expert, or an expert's shares do not sum to
// kShareUnits (a corrupt input, e.g. a placement read back from a checkpoint).
ExpertPlacement placement_from_slots(const PlacementShape& shape, std::vector<int32_t> slot_expert,
                                     std::vector<int32_t> slot_share = {});

// The shares that even out the ranks' loads for these expert loads under placement's slots (the
// "share" step above); (E + R) values in kShareUnits.
std::vector<int32_t> balanced_shares(const ExpertPlacement& placement,
                                     std::span<const double> expert_loads);

// The working memory of balanced_shares: kept by a caller that computes shares every step, so
// that after the first step it allocates nothing.
struct SharesWorkspace {
    std::vector<double> amount, rank_load, base, sorted_base;
    std::vector<int64_t> ranks;
    std::vector<std::pair<double, int32_t>> remainder;
    std::vector<int32_t> share;
};
// balanced_shares into workspace.share.
void balanced_shares(const ExpertPlacement& placement, std::span<const double> expert_loads,
                     SharesWorkspace& workspace);

// The load each rank carries when every expert's load splits over its replicas by their shares
// (what the replica choice of the dispatch follows), (ep) values.
std::vector<double> rank_loads(const ExpertPlacement& placement,
                               std::span<const double> expert_loads);

// max / mean of rank_loads (1 for a perfect balance; 1 when everything is 0).
double rank_imbalance(const ExpertPlacement& placement, std::span<const double> expert_loads);

// The physical slot that serves copy j of a token: one of expert's replicas, chosen
// deterministically so that a run is reproducible: among the replicas in the token's own domain
// (source_rank's) if there are any, else among all of them, in proportion to their shares
// (renormalized over those candidates; evenly when they all have none). The pick walks the shares
// with a golden-ratio sequence of token_index (a low-discrepancy sequence: consecutive tokens
// spread over the replicas in proportion, not in runs), offset by source_rank. token_index numbers
// the token inside its source rank's micro-batch, so a round or a half of it picks the same
// replica.
int32_t choose_replica(const ExpertPlacement& placement, int32_t expert, int64_t source_rank,
                       int64_t token_index);

}  // namespace moetron::parallel
