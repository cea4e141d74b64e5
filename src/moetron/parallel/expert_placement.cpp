#include "moetron/parallel/expert_placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron::parallel {

namespace {

// Replica counts for `experts` (their loads) over num_slots slots: one each, then every extra slot
// to the expert with the highest load per replica (lowest index on ties).
std::vector<int64_t> replicate(std::span<const double> loads, int64_t num_slots) {
    std::vector<int64_t> count(loads.size(), 1);
    for (auto extra = static_cast<int64_t>(loads.size()); extra < num_slots; ++extra) {
        size_t hottest = 0;
        for (size_t e = 1; e < loads.size(); ++e)
            if (loads[e] / static_cast<double>(count[e]) >
                loads[hottest] / static_cast<double>(count[hottest]))
                hottest = e;
        ++count[hottest];
    }
    return count;
}

// An item to pack: a replica (or an expert group), its weight, and a key for ties and conflicts.
struct Item {
    double weight = 0;
    int64_t id = 0;   // ties: lower id first
    int64_t tag = 0;  // items with the same tag prefer different packs (replicas of one expert)
};

// Packs items into num_packs packs of exactly items / num_packs each: heaviest first, each to the
// least loaded pack with room, preferring packs that hold no item of the same tag. Returns the
// pack of every item (in the items' order).
std::vector<int64_t> pack_evenly(const std::vector<Item>& items, int64_t num_packs) {
    const auto per_pack = static_cast<int64_t>(items.size()) / num_packs;
    std::vector<size_t> order(items.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (items[a].weight != items[b].weight) return items[a].weight > items[b].weight;
        return items[a].id < items[b].id;
    });
    std::vector<double> load(static_cast<size_t>(num_packs), 0.0);
    std::vector<int64_t> filled(static_cast<size_t>(num_packs), 0);
    std::vector<std::vector<int64_t>> tags(static_cast<size_t>(num_packs));
    std::vector<int64_t> pack_of(items.size(), -1);
    for (size_t i : order) {
        int64_t best = -1;
        bool best_conflicts = true;
        for (int64_t p = 0; p < num_packs; ++p) {
            const auto pi = static_cast<size_t>(p);
            if (filled[pi] == per_pack) continue;
            const bool conflicts =
                std::find(tags[pi].begin(), tags[pi].end(), items[i].tag) != tags[pi].end();
            const bool better =
                best < 0 || (best_conflicts && !conflicts) ||
                (conflicts == best_conflicts && load[pi] < load[static_cast<size_t>(best)]);
            if (better) {
                best = p;
                best_conflicts = conflicts;
            }
        }
        MT_CHECK(best >= 0, "[placement] no pack has room for item {}", items[i].id);
        const auto bi = static_cast<size_t>(best);
        pack_of[i] = best;
        load[bi] += items[i].weight;
        ++filled[bi];
        tags[bi].push_back(items[i].tag);
    }
    return pack_of;
}

// Places `experts` (global ids, with their loads) on `num_ranks` consecutive ranks starting at
// first_rank: replicate over their slots, pack the replicas, then write each rank's slots in
// ascending expert order into slot_expert.
void place_over_ranks(std::vector<int32_t>& slot_expert, std::span<const int32_t> experts,
                      std::span<const double> loads, int64_t first_rank, int64_t num_ranks,
                      int64_t slots_per_rank) {
    const std::vector<int64_t> count = replicate(loads, num_ranks * slots_per_rank);
    std::vector<Item> replicas;
    for (size_t e = 0; e < experts.size(); ++e)
        for (int64_t r = 0; r < count[e]; ++r)
            replicas.push_back({loads[e] / static_cast<double>(count[e]),
                                static_cast<int64_t>(replicas.size()), experts[e]});
    const std::vector<int64_t> rank_of = pack_evenly(replicas, num_ranks);
    std::vector<std::vector<int32_t>> held(static_cast<size_t>(num_ranks));
    for (size_t i = 0; i < replicas.size(); ++i)
        held[static_cast<size_t>(rank_of[i])].push_back(static_cast<int32_t>(replicas[i].tag));
    for (int64_t r = 0; r < num_ranks; ++r) {
        std::vector<int32_t>& h = held[static_cast<size_t>(r)];
        std::sort(h.begin(), h.end());
        std::copy(
            h.begin(), h.end(),
            slot_expert.begin() + static_cast<std::ptrdiff_t>((first_rank + r) * slots_per_rank));
    }
}

}  // namespace

namespace {

ExpertPlacement with_balanced_shares(ExpertPlacement placement,
                                     std::span<const double> expert_loads) {
    placement.slot_share = balanced_shares(placement, expert_loads);
    return placement;
}

}  // namespace

void check_placement_shape(const PlacementShape& s) {
    MT_USER_CHECK(s.num_experts >= 1 && s.ep_size >= 1,
                  "expert placement needs at least one expert and one rank (got {} experts over "
                  "{} ranks)",
                  s.num_experts, s.ep_size);
    MT_USER_CHECK(s.num_slots >= s.num_experts,
                  "--redundant-experts must be >= 0: {} slots cannot hold {} experts", s.num_slots,
                  s.num_experts);
    MT_USER_CHECK(
        s.num_slots % s.ep_size == 0,
        "--redundant-experts {}: the {} experts plus {} redundant slots ({}) do not split "
        "evenly over the {} expert-parallel ranks; choose R so that {} + R is a "
        "multiple of {}",
        s.num_slots - s.num_experts, s.num_experts, s.num_slots - s.num_experts, s.num_slots,
        s.ep_size, s.num_experts, s.ep_size);
    MT_USER_CHECK(s.num_domains >= 1 && s.ep_size % s.num_domains == 0,
                  "the expert-parallel group of {} ranks does not split into {} scale-up domains",
                  s.ep_size, s.num_domains);
    MT_USER_CHECK(s.num_groups >= 1 && s.num_experts % s.num_groups == 0,
                  "{} experts do not split into {} expert groups", s.num_experts, s.num_groups);
}

ExpertPlacement placement_from_slots(const PlacementShape& shape, std::vector<int32_t> slot_expert,
                                     std::vector<int32_t> slot_share) {
    check_placement_shape(shape);
    MT_CHECK(static_cast<int64_t>(slot_expert.size()) == shape.num_slots,
             "[placement] {} slot entries for {} slots", slot_expert.size(), shape.num_slots);
    ExpertPlacement p;
    p.shape = shape;
    p.replica_first.assign(static_cast<size_t>(shape.num_experts) + 1, 0);
    for (int32_t e : slot_expert) {
        MT_CHECK(e >= 0 && e < shape.num_experts, "[placement] slot holds expert {} of {}", e,
                 shape.num_experts);
        ++p.replica_first[static_cast<size_t>(e) + 1];
    }
    for (int64_t e = 0; e < shape.num_experts; ++e) {
        MT_CHECK(p.replica_first[static_cast<size_t>(e) + 1] > 0,
                 "[placement] expert {} has no slot", e);
        p.replica_first[static_cast<size_t>(e) + 1] += p.replica_first[static_cast<size_t>(e)];
    }
    p.replica_slots.resize(slot_expert.size());
    std::vector<int64_t> next(p.replica_first.begin(), p.replica_first.end() - 1);
    for (size_t s = 0; s < slot_expert.size(); ++s)
        p.replica_slots[static_cast<size_t>(next[static_cast<size_t>(slot_expert[s])]++)] =
            static_cast<int32_t>(s);
    p.slot_expert = std::move(slot_expert);
    if (slot_share.empty()) {
        slot_share = balanced_shares(p, std::vector<double>(static_cast<size_t>(shape.num_experts),
                                                            0.0));  // no load: even
    }
    MT_CHECK(slot_share.size() == p.slot_expert.size(), "[placement] {} shares for {} slots",
             slot_share.size(), p.slot_expert.size());
    for (int64_t e = 0; e < shape.num_experts; ++e) {
        int64_t sum = 0;
        for (int32_t s : p.slots_of(e)) {
            const int32_t share = slot_share[static_cast<size_t>(s)];
            MT_CHECK(share >= 0 && share <= kShareUnits, "[placement] slot {} has share {}", s,
                     share);
            sum += share;
        }
        MT_CHECK(sum == kShareUnits, "[placement] expert {}'s shares sum to {}, not {}", e, sum,
                 kShareUnits);
    }
    p.slot_share = std::move(slot_share);
    return p;
}

std::vector<int32_t> balanced_shares(const ExpertPlacement& placement,
                                     std::span<const double> expert_loads) {
    SharesWorkspace workspace;
    balanced_shares(placement, expert_loads, workspace);
    return std::move(workspace.share);
}

void balanced_shares(const ExpertPlacement& placement, std::span<const double> expert_loads,
                     SharesWorkspace& workspace) {
    const PlacementShape& shape = placement.shape;
    MT_CHECK(static_cast<int64_t>(expert_loads.size()) == shape.num_experts,
             "[placement] {} loads for {} experts", expert_loads.size(), shape.num_experts);
    // Tokens per slot, starting from the even split.
    std::vector<double>& amount = workspace.amount;
    std::vector<double>& rank_load = workspace.rank_load;
    amount.assign(placement.slot_expert.size(), 0.0);
    rank_load.assign(static_cast<size_t>(shape.ep_size), 0.0);
    for (size_t s = 0; s < amount.size(); ++s) {
        const int32_t e = placement.slot_expert[s];
        amount[s] =
            expert_loads[static_cast<size_t>(e)] / static_cast<double>(placement.replicas(e));
        rank_load[static_cast<size_t>(placement.rank_of_slot(static_cast<int64_t>(s)))] +=
            amount[s];
    }
    // Water-filling: each replicated expert in turn spreads its load over its replicas' ranks to
    // raise the least loaded ones to a common level, the others' loads held fixed. An expert's
    // slots are ascending, so two replicas on one rank are neighbours: they split that rank's part.
    constexpr int kPasses = 32;  // the loads settle in a few; more passes cost microseconds
    std::vector<int64_t>& ranks = workspace.ranks;
    std::vector<double>&base = workspace.base, &sorted_base = workspace.sorted_base;
    for (int pass = 0; pass < kPasses; ++pass) {
        for (int64_t e = 0; e < shape.num_experts; ++e) {
            const std::span<const int32_t> slots = placement.slots_of(e);
            if (slots.size() < 2) continue;
            ranks.clear();
            base.clear();
            for (int32_t s : slots) {
                const int64_t r = placement.rank_of_slot(s);
                if (ranks.empty() || ranks.back() != r) {
                    ranks.push_back(r);
                    base.push_back(rank_load[static_cast<size_t>(r)]);
                }
                base.back() -= amount[static_cast<size_t>(s)];
            }
            sorted_base = base;
            std::sort(sorted_base.begin(), sorted_base.end());
            // The level h with sum over ranks of max(0, h - base) = the expert's load.
            const double load = expert_loads[static_cast<size_t>(e)];
            double filled = load, level = 0;
            for (size_t m = 0; m < sorted_base.size(); ++m) {
                filled += sorted_base[m];
                level = filled / static_cast<double>(m + 1);
                if (m + 1 == sorted_base.size() || level <= sorted_base[m + 1]) break;
            }
            size_t j = 0;
            for (size_t i = 0; i < slots.size(); ++i) {
                const int64_t r = placement.rank_of_slot(slots[i]);
                while (ranks[j] != r) ++j;
                size_t on_rank = 1;
                while (i + on_rank < slots.size() &&
                       placement.rank_of_slot(slots[i + on_rank]) == r)
                    ++on_rank;
                const double part = std::max(0.0, level - base[j]);
                for (size_t k = 0; k < on_rank; ++k)
                    amount[static_cast<size_t>(slots[i + k])] = part / static_cast<double>(on_rank);
                rank_load[static_cast<size_t>(r)] = base[j] + part;
                i += on_rank - 1;
            }
        }
    }
    // To kShareUnits per expert: floors, then the units left over to the largest remainders (the
    // lowest slot on ties). An expert without load splits evenly.
    std::vector<int32_t>& share = workspace.share;
    share.assign(amount.size(), 0);
    std::vector<std::pair<double, int32_t>>& remainder = workspace.remainder;
    for (int64_t e = 0; e < shape.num_experts; ++e) {
        const std::span<const int32_t> slots = placement.slots_of(e);
        double total = 0;
        for (int32_t s : slots) total += amount[static_cast<size_t>(s)];
        remainder.clear();
        int64_t given = 0;
        for (int32_t s : slots) {
            const double exact =
                total > 0 ? amount[static_cast<size_t>(s)] / total * kShareUnits
                          : static_cast<double>(kShareUnits) / static_cast<double>(slots.size());
            const auto units = static_cast<int32_t>(std::floor(exact));
            share[static_cast<size_t>(s)] = units;
            given += units;
            remainder.emplace_back(exact - units, s);
        }
        std::stable_sort(remainder.begin(), remainder.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        for (size_t i = 0; given < kShareUnits; ++i, ++given)
            ++share[static_cast<size_t>(remainder[i % remainder.size()].second)];
    }
}

ExpertPlacement balanced_placement(std::span<const double> expert_loads,
                                   const PlacementShape& shape) {
    check_placement_shape(shape);
    MT_CHECK(static_cast<int64_t>(expert_loads.size()) == shape.num_experts,
             "[placement] {} loads for {} experts", expert_loads.size(), shape.num_experts);
    for (double load : expert_loads)
        MT_CHECK(std::isfinite(load) && load >= 0, "[placement] bad expert load {}", load);
    std::vector<int32_t> slot_expert(static_cast<size_t>(shape.num_slots), -1);
    const int64_t slots_per_rank = shape.slots_per_rank();
    if (!shape.hierarchical()) {
        std::vector<int32_t> all(static_cast<size_t>(shape.num_experts));
        std::iota(all.begin(), all.end(), 0);
        place_over_ranks(slot_expert, all, expert_loads, 0, shape.ep_size, slots_per_rank);
        return with_balanced_shares(placement_from_slots(shape, std::move(slot_expert)),
                                    expert_loads);
    }
    // Groups onto domains, then each domain on its own.
    const int64_t group_size = shape.num_experts / shape.num_groups;
    std::vector<Item> groups(static_cast<size_t>(shape.num_groups));
    for (int64_t g = 0; g < shape.num_groups; ++g) {
        double sum = 0;
        for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e)
            sum += expert_loads[static_cast<size_t>(e)];
        groups[static_cast<size_t>(g)] = {sum, g, g};
    }
    const std::vector<int64_t> domain_of = pack_evenly(groups, shape.num_domains);
    const int64_t ranks_per_domain = shape.ranks_per_domain();
    for (int64_t d = 0; d < shape.num_domains; ++d) {
        std::vector<int32_t> experts;
        std::vector<double> loads;
        for (int64_t g = 0; g < shape.num_groups; ++g) {
            if (domain_of[static_cast<size_t>(g)] != d) continue;
            for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
                experts.push_back(static_cast<int32_t>(e));
                loads.push_back(expert_loads[static_cast<size_t>(e)]);
            }
        }
        place_over_ranks(slot_expert, experts, loads, d * ranks_per_domain, ranks_per_domain,
                         slots_per_rank);
    }
    return with_balanced_shares(placement_from_slots(shape, std::move(slot_expert)), expert_loads);
}

ExpertPlacement keep_slots_in_place(const ExpertPlacement& previous, const ExpertPlacement& next) {
    MT_CHECK(previous.slot_expert.size() == next.slot_expert.size(),
             "[placement] {} slots before, {} after", previous.slot_expert.size(),
             next.slot_expert.size());
    const int64_t per_rank = next.shape.slots_per_rank();
    std::vector<int32_t> slot_expert(next.slot_expert.size(), -1);
    std::vector<int32_t> held;  // the rank's experts in next, not yet given a slot
    for (int64_t rank = 0; rank < next.shape.ep_size; ++rank) {
        const auto first = static_cast<size_t>(rank * per_rank);
        const auto last = first + static_cast<size_t>(per_rank);
        held.assign(next.slot_expert.begin() + static_cast<std::ptrdiff_t>(first),
                    next.slot_expert.begin() + static_cast<std::ptrdiff_t>(last));
        for (size_t s = first; s < last; ++s) {
            const auto kept = std::find(held.begin(), held.end(), previous.slot_expert[s]);
            if (kept == held.end()) continue;
            slot_expert[s] = *kept;
            held.erase(kept);
        }
        std::sort(held.begin(), held.end());
        auto next_held = held.begin();
        for (size_t s = first; s < last; ++s)
            if (slot_expert[s] < 0) slot_expert[s] = *next_held++;
    }
    return placement_from_slots(next.shape, std::move(slot_expert));
}

ExpertPlacement initial_placement(const PlacementShape& shape) {
    check_placement_shape(shape);
    if (shape.num_slots == shape.num_experts) {  // the contiguous split of a run without EPLB
        std::vector<int32_t> slot_expert(static_cast<size_t>(shape.num_slots));
        std::iota(slot_expert.begin(), slot_expert.end(), 0);
        return placement_from_slots(shape, std::move(slot_expert));
    }
    const std::vector<double> equal(static_cast<size_t>(shape.num_experts), 1.0);
    return balanced_placement(equal, shape);
}

std::vector<double> rank_loads(const ExpertPlacement& placement,
                               std::span<const double> expert_loads) {
    MT_CHECK(static_cast<int64_t>(expert_loads.size()) == placement.shape.num_experts,
             "[placement] {} loads for {} experts", expert_loads.size(),
             placement.shape.num_experts);
    std::vector<double> load(static_cast<size_t>(placement.shape.ep_size), 0.0);
    for (size_t s = 0; s < placement.slot_expert.size(); ++s) {
        const int32_t e = placement.slot_expert[s];
        load[static_cast<size_t>(placement.rank_of_slot(static_cast<int64_t>(s)))] +=
            expert_loads[static_cast<size_t>(e)] * placement.slot_share[s] / kShareUnits;
    }
    return load;
}

double rank_imbalance(const ExpertPlacement& placement, std::span<const double> expert_loads) {
    const std::vector<double> load = rank_loads(placement, expert_loads);
    const double total = std::accumulate(load.begin(), load.end(), 0.0);
    if (total <= 0) return 1.0;
    return *std::max_element(load.begin(), load.end()) / (total / static_cast<double>(load.size()));
}

int32_t choose_replica(const ExpertPlacement& placement, int32_t expert, int64_t source_rank,
                       int64_t token_index) {
    const std::span<const int32_t> slots = placement.slots_of(expert);
    if (slots.size() == 1) return slots[0];
    // The replicas in the source's domain are consecutive in `slots` (ascending, and the domain's
    // ranks hold consecutive slots).
    const int64_t domain_slots =
        placement.shape.ranks_per_domain() * placement.shape.slots_per_rank();
    const int64_t domain = source_rank / placement.shape.ranks_per_domain();
    auto first = std::lower_bound(slots.begin(), slots.end(), domain * domain_slots);
    auto last = std::lower_bound(first, slots.end(), (domain + 1) * domain_slots);
    std::span<const int32_t> candidates = first == last ? slots : std::span(first, last);
    int64_t total = 0;
    for (int32_t s : candidates) total += placement.slot_share[static_cast<size_t>(s)];
    const bool even = total == 0;
    if (even) total = static_cast<int64_t>(candidates.size());
    // frac(n / golden ratio) in 32 bits: consecutive n land evenly over [0, 1) at every length.
    constexpr uint64_t kGoldenFraction = 2654435769u;  // 2^32 / golden ratio
    const uint64_t position = (static_cast<uint64_t>(token_index + 1) * kGoldenFraction +
                               static_cast<uint64_t>(source_rank) * 0x85EBCA6Bu) &
                              0xFFFFFFFFu;
    int64_t pick = static_cast<int64_t>((position * static_cast<uint64_t>(total)) >> 32);
    for (int32_t s : candidates) {
        pick -= even ? 1 : placement.slot_share[static_cast<size_t>(s)];
        if (pick < 0) return s;
    }
    MT_THROW("[placement] no replica picked for expert {}", expert);
}

}  // namespace moetron::parallel
