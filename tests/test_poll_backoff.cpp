// parallel/poll_backoff.h: the progress thread's sleep between sweeps doubles while nothing
// completes (a pipeline's early-posted receive must not cost a core's fifth in polling), is
// capped, and returns to the base interval as soon as a request completes or arrives.
#include <gtest/gtest.h>

#include "moetron/parallel/poll_backoff.h"

namespace moetron::parallel {
namespace {

TEST(PollBackoff, DoublesWhileSweepsCompleteNothingUpToTheCap) {
    PollBackoff b(50e-6, 16);
    EXPECT_DOUBLE_EQ(b.interval_s(), 50e-6);
    b.idle_sweep();
    EXPECT_DOUBLE_EQ(b.interval_s(), 100e-6);
    for (int i = 0; i < 10; ++i) b.idle_sweep();
    EXPECT_DOUBLE_EQ(b.interval_s(), 800e-6);
}

TEST(PollBackoff, ReturnsToTheBaseIntervalOnProgress) {
    PollBackoff b(50e-6);
    for (int i = 0; i < 3; ++i) b.idle_sweep();
    EXPECT_GT(b.interval_s(), 50e-6);
    b.progressed();
    EXPECT_DOUBLE_EQ(b.interval_s(), 50e-6);
}

TEST(PollBackoff, SweepsOfAReceiveWaitingTenMillisecondsForItsPeer) {
    // What the thread costs while one receive waits 10 ms for its sender: sweeps until the slept
    // time reaches 10 ms. Every 50 us that was 200 sweeps; backing off, under 20.
    PollBackoff b(50e-6);
    int sweeps = 0;
    for (double slept_s = 0; slept_s < 10e-3; ++sweeps) {
        slept_s += b.interval_s();
        b.idle_sweep();
    }
    EXPECT_LT(sweeps, 20);
}

}  // namespace
}  // namespace moetron::parallel
