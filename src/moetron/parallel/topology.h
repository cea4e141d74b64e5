// Where every rank sits: a Layout resolved against the world and its scale-up domains, the
// groups each rank belongs to (pure functions, testable without MPI), and the builder that splits
// real communicators along them.
//
// world = domains x domain_size: consecutive ranks share a scale-up domain (on one machine,
// domain_size splits the local ranks into emulated domains).
// Attention side: rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i   (tp fastest, as
// Megatron-LM orders it, so a TP group is consecutive ranks inside one domain).
// Expert side, "parallel folding" (Megatron-Core's MoE parallel folding): the same ranks
// re-partitioned independently of TP x DP as rank = (pp_i * edp + edp_i) * ep + ep_i with expert
// TP = 1 and edp = world / (ep * pp); EP groups are consecutive ranks, inside one domain when
// ep <= domain_size.
// Rail group: the ranks with the same local index in every domain (the scale-out "rail" that the
// two-tier dispatch crosses once per target domain). The two-tier dispatch works inside one EP
// group: ep_domain = the EP group's ranks in this rank's domain, ep_rail = the EP group's ranks
// with this rank's local index (one per domain the EP group spans). When the EP group lies in one
// domain, ep_domain is the EP group and ep_rail this rank alone.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/parallel/communicator.h"
#include "moetron/parallel/layout.h"

namespace moetron::parallel {

struct Topology {
    int world_size = 1;
    int domain_size = 1;  // ranks per scale-up domain
    int tp = 1, cp = 1, dp = 1, pp = 1;
    int ep = 1, edp = 1;
    int vpp = 1;  // model chunks per pipeline stage

    int num_domains() const { return world_size / domain_size; }
    // The EP group's ranks inside one domain (the whole group when it fits in one), and the
    // domains it spans: what the two-tier dispatch routes by and the flat one counts bytes by.
    int ep_ranks_per_domain() const { return ep < domain_size ? ep : domain_size; }
    int ep_domains() const { return ep / ep_ranks_per_domain(); }
    // The resolved layout (dp included), whose str() is the one spelling of a layout.
    Layout layout() const;
    // "tp2.pp1.vpp1.ep4.cp1.dp2 (world 8 in 2 domains of 4, edp2)": the layout as Layout::str
    // spells it, and what the world adds to it.
    std::string str() const;
};

// Resolves the layout against the world (resolve_layout) and checks what the engine can run,
// before any work. domain_size 0 means the whole world is one domain. Throws moetron::UserError
// saying why a layout cannot run: sizes that do not divide the world, cp > 1 (not supported
// yet), domain_size not dividing the world, a TP or EP group that would straddle two
// domains. The checks against the model are model/layout_fit.h's.
Topology make_topology(const Layout& layout, int world_size, int domain_size = 0);

enum class GroupKind { tp, cp, dp, pp, ep, edp, rail, ep_domain, ep_rail };
inline constexpr GroupKind kAllGroupKinds[] = {
    GroupKind::tp,  GroupKind::cp,   GroupKind::dp,        GroupKind::pp,     GroupKind::ep,
    GroupKind::edp, GroupKind::rail, GroupKind::ep_domain, GroupKind::ep_rail};
std::string_view group_kind_name(GroupKind kind);  // "tp", "ep", ...

struct RankCoordinates {
    int tp = 0, cp = 0, dp = 0, pp = 0;  // attention side
    int ep = 0, edp = 0, expert_pp = 0;  // expert side (pp coordinate is the same rank split)
    int domain = 0, local = 0;           // domain index and index inside it
};
RankCoordinates coordinates_of(const Topology& topology, int rank);

struct GroupMembership {
    std::vector<int> ranks;  // world ranks of the group, in group order
    int index = 0;           // this rank's position in ranks (its rank in the group)
    int color = 0;           // the same for every member, different between groups (for split)
};
GroupMembership group_of(const Topology& topology, GroupKind kind, int rank);

// Communicators for every group of this rank, split from world (a collective over world).
struct ParallelGroups {
    std::unique_ptr<Communicator> tp, cp, dp, pp, ep, edp, rail, ep_domain, ep_rail;
    std::unique_ptr<Communicator>& slot(GroupKind kind);
    Communicator& get(GroupKind kind);  // throws when that group was not built
};
ParallelGroups build_groups(Communicator& world, const Topology& topology);

}  // namespace moetron::parallel
