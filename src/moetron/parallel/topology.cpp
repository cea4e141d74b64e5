#include "moetron/parallel/topology.h"

#include <fmt/format.h>

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron::parallel {

namespace {

// A group of `size` consecutive ranks (or consecutive blocks of whole domains) must not straddle
// a domain boundary: per-layer traffic has to stay on the scale-up tier.
void check_inside_domains(std::string_view what, int size, int domain_size) {
    const bool fits = size <= domain_size ? domain_size % size == 0 : size % domain_size == 0;
    MT_USER_CHECK(fits,
                  "[layout] {} {} with domain_size {}: {} groups are consecutive ranks, so one "
                  "would straddle two scale-up domains; choose a {} that divides {} or is a "
                  "multiple of it",
                  what, size, domain_size, what, what, domain_size);
}

}  // namespace

Layout Topology::layout() const {
    Layout l;
    l.tp = tp;
    l.pp = pp;
    l.vpp = vpp;
    l.ep = ep;
    l.cp = cp;
    l.dp = dp;
    return l;
}

std::string Topology::str() const {
    return fmt::format("{} (world {} in {} domain{} of {}, edp{})", layout().str(), world_size,
                       num_domains(), num_domains() == 1 ? "" : "s", domain_size, edp);
}

Topology make_topology(const Layout& layout, int world_size, int domain_size) {
    MT_USER_CHECK(world_size >= 1, "[layout] world size must be >= 1, got {}", world_size);
    MT_USER_CHECK(domain_size >= 0, "[layout] domain_size must be >= 0 (0: one domain), got {}",
                  domain_size);
    MT_USER_CHECK(layout.cp == 1,
                  "[layout] context parallelism (cp {}) is not supported yet; use cp1", layout.cp);
    const Layout resolved = resolve_layout(layout, world_size);

    // Every size is at most world_size (an int) once resolved.
    Topology t;
    t.world_size = world_size;
    t.domain_size = domain_size == 0 ? world_size : domain_size;
    MT_USER_CHECK(world_size % t.domain_size == 0,
                  "[layout] domain_size {} does not divide the world of {} ranks", t.domain_size,
                  world_size);
    t.tp = static_cast<int>(resolved.tp);
    t.cp = static_cast<int>(resolved.cp);
    t.pp = static_cast<int>(resolved.pp);
    t.vpp = static_cast<int>(resolved.vpp);
    t.dp = static_cast<int>(resolved.dp);
    t.ep = static_cast<int>(resolved.ep);
    t.edp = static_cast<int>(resolved.edp());

    check_inside_domains("tp", t.tp, t.domain_size);
    check_inside_domains("ep", t.ep, t.domain_size);
    return t;
}

std::string_view group_kind_name(GroupKind kind) {
    switch (kind) {
        case GroupKind::tp:
            return "tp";
        case GroupKind::cp:
            return "cp";
        case GroupKind::dp:
            return "dp";
        case GroupKind::pp:
            return "pp";
        case GroupKind::ep:
            return "ep";
        case GroupKind::edp:
            return "edp";
        case GroupKind::rail:
            return "rail";
        case GroupKind::ep_domain:
            return "ep_domain";
        case GroupKind::ep_rail:
            return "ep_rail";
    }
    return "unknown";
}

RankCoordinates coordinates_of(const Topology& t, int rank) {
    MT_CHECK(rank >= 0 && rank < t.world_size, "[layout] rank {} is not in the world of {}", rank,
             t.world_size);
    RankCoordinates c;
    int r = rank;
    c.tp = r % t.tp;
    r /= t.tp;
    c.cp = r % t.cp;
    r /= t.cp;
    c.dp = r % t.dp;
    c.pp = r / t.dp;

    c.ep = rank % t.ep;
    c.edp = (rank / t.ep) % t.edp;
    c.expert_pp = rank / (t.ep * t.edp);

    c.domain = rank / t.domain_size;
    c.local = rank % t.domain_size;
    return c;
}

GroupMembership group_of(const Topology& t, GroupKind kind, int rank) {
    const RankCoordinates c = coordinates_of(t, rank);
    auto attention_rank = [&t](int tp, int cp, int dp, int pp) {
        return ((pp * t.dp + dp) * t.cp + cp) * t.tp + tp;
    };
    auto expert_rank = [&t](int ep, int edp, int pp) { return (pp * t.edp + edp) * t.ep + ep; };

    GroupMembership g;
    switch (kind) {
        case GroupKind::tp:
            for (int i = 0; i < t.tp; ++i) g.ranks.push_back(attention_rank(i, c.cp, c.dp, c.pp));
            g.index = c.tp;
            break;
        case GroupKind::cp:
            for (int i = 0; i < t.cp; ++i) g.ranks.push_back(attention_rank(c.tp, i, c.dp, c.pp));
            g.index = c.cp;
            break;
        case GroupKind::dp:
            for (int i = 0; i < t.dp; ++i) g.ranks.push_back(attention_rank(c.tp, c.cp, i, c.pp));
            g.index = c.dp;
            break;
        case GroupKind::pp:
            for (int i = 0; i < t.pp; ++i) g.ranks.push_back(attention_rank(c.tp, c.cp, c.dp, i));
            g.index = c.pp;
            break;
        case GroupKind::ep:
            for (int i = 0; i < t.ep; ++i) g.ranks.push_back(expert_rank(i, c.edp, c.expert_pp));
            g.index = c.ep;
            break;
        case GroupKind::edp:
            for (int i = 0; i < t.edp; ++i) g.ranks.push_back(expert_rank(c.ep, i, c.expert_pp));
            g.index = c.edp;
            break;
        case GroupKind::rail:
            for (int d = 0; d < t.num_domains(); ++d)
                g.ranks.push_back(d * t.domain_size + c.local);
            g.index = c.domain;
            break;
        case GroupKind::ep_domain: {  // EP ranks [first, first + L) of this rank's domain
            const int per_domain = t.ep_ranks_per_domain();
            const int first = c.ep / per_domain * per_domain;
            for (int i = first; i < first + per_domain; ++i)
                g.ranks.push_back(expert_rank(i, c.edp, c.expert_pp));
            g.index = c.ep - first;
            break;
        }
        case GroupKind::ep_rail: {  // EP ranks with this rank's local index, one per domain
            const int per_domain = t.ep_ranks_per_domain();
            for (int i = c.ep % per_domain; i < t.ep; i += per_domain)
                g.ranks.push_back(expert_rank(i, c.edp, c.expert_pp));
            g.index = c.ep / per_domain;
            break;
        }
    }
    // Every group lists its ranks in increasing order, so its first rank names it uniquely.
    g.color = g.ranks.front();
    return g;
}

std::unique_ptr<Communicator>& ParallelGroups::slot(GroupKind kind) {
    switch (kind) {
        case GroupKind::tp:
            return tp;
        case GroupKind::cp:
            return cp;
        case GroupKind::dp:
            return dp;
        case GroupKind::pp:
            return pp;
        case GroupKind::ep:
            return ep;
        case GroupKind::edp:
            return edp;
        case GroupKind::rail:
            return rail;
        case GroupKind::ep_domain:
            return ep_domain;
        case GroupKind::ep_rail:
            return ep_rail;
    }
    MT_THROW("[layout] unknown group kind {}", static_cast<int>(kind));
}

Communicator& ParallelGroups::get(GroupKind kind) {
    std::unique_ptr<Communicator>& group = slot(kind);
    MT_CHECK(group != nullptr, "[layout] group {} was not built", group_kind_name(kind));
    return *group;
}

ParallelGroups build_groups(Communicator& world, const Topology& topology) {
    MT_CHECK(world.size() == topology.world_size,
             "[layout] topology is for {} ranks but group '{}' has {}", topology.world_size,
             world.name(), world.size());
    ParallelGroups groups;
    for (GroupKind kind : kAllGroupKinds) {
        const GroupMembership m = group_of(topology, kind, world.rank());
        groups.slot(kind) = world.split(m.color, m.index, std::string(group_kind_name(kind)));
    }
    return groups;
}

}  // namespace moetron::parallel
