// moetron calibrate's multi-rank measurements under mpirun: the spread of the ranks (how far the
// slowest runs behind their mean) is a finite, bounded fraction, the same on every rank (the
// cluster file and the model's use of it: test_calibrate.cpp, test_sim_hardware.cpp).
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
    EXPECT_GT(coll.spread_repetitions, 0);
    ASSERT_TRUE(std::isfinite(coll.slowest_rank_excess));
    EXPECT_GE(coll.slowest_rank_excess, 0);
    // The slowest of n can run at most n - 1 times the mean behind it (the others took 0).
    EXPECT_LE(coll.slowest_rank_excess, world.size() - 1.0);
    double on_rank0[2] = {coll.slowest_rank_excess, static_cast<double>(coll.spread_repetitions)};
    world.broadcast(on_rank0, 2, DType::f64, 0, kHostStream);
    EXPECT_EQ(coll.slowest_rank_excess, on_rank0[0]);
    EXPECT_EQ(static_cast<double>(coll.spread_repetitions), on_rank0[1]);
}

}  // namespace
}  // namespace moetron::testing
