// moetron calibrate's multi-rank measurements under mpirun: the spread of the ranks (how far the
// slowest runs behind their mean) is a finite, bounded fraction at each block length; blocks grow
// longer one after the other (a block's duration is its fastest run, so 8 layers never undercut
// 2, whatever preempts a run); every rank reports the same (the cluster file and the model's use
// of it: test_calibrate.cpp, test_sim_hardware.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "moetron/calibrate/calibrate.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

TEST(MpiCalibrate, EveryRankAgreesOnHowFarTheSlowestRankRunsBehind) {
    parallel::Communicator& world = mpi_world();
    if (world.size() < 2) GTEST_SKIP() << "the spread of the ranks needs two or more";
    calibrate::CalibrateOptions o;
    o.quick = true;
    o.seconds_per_point = 0.002;
    const calibrate::CollectiveMeasurements coll = calibrate::measure_collectives(world, o);
    EXPECT_EQ(coll.ranks, world.size());
    ASSERT_EQ(coll.slowest_rank.size(), 2u);  // quick: two block lengths
    for (size_t i = 0; i < coll.slowest_rank.size(); ++i) {
        const auto& p = coll.slowest_rank[i];
        EXPECT_GT(p.repetitions, 0);
        ASSERT_TRUE(std::isfinite(p.excess));
        EXPECT_GE(p.excess, 0);
        // The slowest of n can run at most n - 1 times the mean behind it (the others took 0).
        EXPECT_LE(p.excess, world.size() - 1.0);
        EXPECT_GT(p.block_s, 0);
        if (i > 0) {
            EXPECT_GT(p.block_s, coll.slowest_rank[i - 1].block_s);
        }
        double on_rank0[3] = {p.excess, p.block_s, static_cast<double>(p.repetitions)};
        world.broadcast(on_rank0, 3, DType::f64, 0, kHostStream);
        EXPECT_EQ(p.excess, on_rank0[0]);
        EXPECT_EQ(p.block_s, on_rank0[1]);
        EXPECT_EQ(static_cast<double>(p.repetitions), on_rank0[2]);
    }
}

}  // namespace
}  // namespace moetron::testing
