// build_groups under mpirun: the communicators it splits hold exactly the ranks that the pure
// group_of() computes, in the same order, for every layout that fits the world.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/parallel/topology.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

using parallel::GroupKind;

void check_layout(const std::string& layout_text, int domain_size) {
    parallel::Communicator& world = mpi_world();
    SCOPED_TRACE(layout_text + " domain_size " + std::to_string(domain_size));
    const parallel::Topology topo =
        parallel::make_topology(parallel::parse_layout(layout_text), world.size(), domain_size);
    parallel::ParallelGroups groups = parallel::build_groups(world, topo);
    for (GroupKind kind : parallel::kAllGroupKinds) {
        const parallel::GroupMembership want = parallel::group_of(topo, kind, world.rank());
        parallel::Communicator& group = groups.get(kind);
        EXPECT_EQ(group.name(), parallel::group_kind_name(kind));
        ASSERT_EQ(group.size(), static_cast<int>(want.ranks.size()))
            << parallel::group_kind_name(kind);
        EXPECT_EQ(group.rank(), want.index) << parallel::group_kind_name(kind);
        // Every member reports its world rank; the group must list them in group order.
        const int32_t mine = world.rank();
        std::vector<int32_t> members(want.ranks.size());
        group.all_gather(std::span<int32_t>(members), std::span<const int32_t>(&mine, 1),
                         kHostStream);
        EXPECT_EQ(std::vector<int>(members.begin(), members.end()), want.ranks)
            << parallel::group_kind_name(kind);
    }
}

TEST(MpiTopology, GroupsMatchThePureFunctions) {
    const int n = mpi_world().size();
    check_layout("", 0);  // all data parallel
    check_layout("ep" + std::to_string(n), 0);
    check_layout("tp" + std::to_string(n), 0);
    if (n == 4) {
        check_layout("tp2.ep2", 2);
        check_layout("dp4.ep2", 2);
        check_layout("dp2.tp2.ep4", 2);
        check_layout("ep4", 2);
        check_layout("tp2.ep4", 4);
        check_layout("ep2", 1);
    }
    if (n == 2) check_layout("tp2.ep2", 1);
}

TEST(MpiTopology, BuilderRejectsATopologyForAnotherWorld) {
    parallel::Communicator& world = mpi_world();
    const parallel::Topology topo =
        parallel::make_topology(parallel::Layout{}, world.size() * 2, 0);
    EXPECT_THROW(parallel::build_groups(world, topo), Error);
}

}  // namespace
}  // namespace moetron::testing
