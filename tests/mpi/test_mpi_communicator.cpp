// The MPI communicator under mpirun: every collective (blocking and async) against values each
// rank can predict, byte counters, split, argument errors, the timeout, and the progress thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/mpi_progress.h"
#include "moetron/parallel/poll_backoff.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

using parallel::CollectiveKind;
using parallel::Communicator;
using parallel::PollBackoff;

// A value every rank can compute for (rank, index), exact in float.
float value_of(int rank, size_t i) {
    return static_cast<float>(rank * 1000 + static_cast<int>(i));
}

TEST(MpiCommunicator, RankSizeAndName) {
    Communicator& world = mpi_world();
    EXPECT_EQ(world.name(), "world");
    EXPECT_GE(world.rank(), 0);
    EXPECT_LT(world.rank(), world.size());
    // The progress thread runs exactly when MPI grants MPI_THREAD_MULTIPLE (Open MPI 4.1 does).
    EXPECT_EQ(world.progress_thread_active(), mpi_session().thread_multiple());
}

TEST(MpiCommunicator, AllReduceSumFloatAndDouble) {
    Communicator& world = mpi_world();
    const int n = world.size(), r = world.rank();
    std::vector<float> f(37);
    std::vector<double> d(5);
    for (size_t i = 0; i < f.size(); ++i) f[i] = value_of(r, i);
    for (size_t i = 0; i < d.size(); ++i) d[i] = 0.5 * r + static_cast<double>(i);
    world.all_reduce_sum(std::span<float>(f), kHostStream);
    world.all_reduce_sum(std::span<double>(d), kHostStream);
    for (size_t i = 0; i < f.size(); ++i) {
        float want = 0;
        for (int p = 0; p < n; ++p) want += value_of(p, i);
        EXPECT_EQ(f[i], want) << i;
    }
    for (size_t i = 0; i < d.size(); ++i)
        EXPECT_DOUBLE_EQ(d[i], 0.25 * n * (n - 1) + n * static_cast<double>(i));
}

TEST(MpiCommunicator, ReduceScatterAllGatherBroadcast) {
    Communicator& world = mpi_world();
    const int n = world.size(), r = world.rank();
    const size_t count = 3;
    std::vector<float> inp(count * n), out(count);
    for (size_t i = 0; i < inp.size(); ++i) inp[i] = value_of(r, i);
    world.reduce_scatter_sum(out.data(), inp.data(), count, DType::f32, kHostStream);
    for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int p = 0; p < n; ++p) want += value_of(p, r * count + i);
        EXPECT_EQ(out[i], want);
    }

    std::vector<double> mine = {1.0 * r, 2.0 * r}, all(2 * n);
    world.all_gather(std::span<double>(all), std::span<const double>(mine), kHostStream);
    for (int p = 0; p < n; ++p) {
        EXPECT_EQ(all[2 * p], 1.0 * p);
        EXPECT_EQ(all[2 * p + 1], 2.0 * p);
    }

    const int root = n - 1;
    std::vector<int32_t> b(4, r == root ? 42 : -1);
    world.broadcast(b.data(), b.size(), DType::i32, root, kHostStream);
    for (int32_t x : b) EXPECT_EQ(x, 42);
    world.barrier();
}

// Rank r sends (r + p) % 3 elements to p, valued by (source, destination, index); zero counts
// (to self when r == 0 ... ) happen for some pairs on every size > 1.
TEST(MpiCommunicator, AllToAllVTypedAndBytes) {
    Communicator& world = mpi_world();
    const int n = world.size(), r = world.rank();
    auto count_of = [](int src, int dst) { return (src + dst) % 3; };
    auto payload = [](int src, int dst, int i) {
        return static_cast<float>(src * 100 + dst * 10 + i);
    };
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    int send_total = 0, recv_total = 0;
    for (int p = 0; p < n; ++p) {
        sc[p] = count_of(r, p);
        sd[p] = send_total;
        send_total += sc[p];
        rc[p] = count_of(p, r);
        rd[p] = recv_total;
        recv_total += rc[p];
    }
    std::vector<float> send(send_total), recv(recv_total, -1.0f);
    for (int p = 0; p < n; ++p)
        for (int i = 0; i < sc[p]; ++i) send[sd[p] + i] = payload(r, p, i);

    world.reset_counters();
    world.all_to_all_v(recv.data(), rc, rd, send.data(), sc, sd, kHostStream);
    for (int p = 0; p < n; ++p)
        for (int i = 0; i < rc[p]; ++i) EXPECT_EQ(recv[rd[p] + i], payload(p, r, i));
    const auto& counters = world.counters(CollectiveKind::all_to_all);
    EXPECT_EQ(counters.calls, 1u);
    EXPECT_EQ(counters.payload_bytes, static_cast<uint64_t>(send_total) * sizeof(float));
    EXPECT_EQ(counters.peer_bytes, static_cast<uint64_t>(send_total - sc[r]) * sizeof(float));

    // The same exchange as raw bytes.
    std::vector<int> scb(n), sdb(n), rcb(n), rdb(n);
    for (int p = 0; p < n; ++p) {
        scb[p] = sc[p] * 4;
        sdb[p] = sd[p] * 4;
        rcb[p] = rc[p] * 4;
        rdb[p] = rd[p] * 4;
    }
    std::vector<float> recv_bytes(recv_total, -1.0f);
    world.all_to_all_v(recv_bytes.data(), rcb, rdb, send.data(), scb, sdb, DType::u8, kHostStream);
    EXPECT_EQ(recv_bytes, recv);
    EXPECT_EQ(world.counters(CollectiveKind::all_to_all).calls, 2u);
}

TEST(MpiCommunicator, AsyncFormsCompleteOutOfOrder) {
    Communicator& world = mpi_world();
    const int n = world.size(), r = world.rank();
    std::vector<float> a(1000, 1.0f + r);
    std::vector<double> b(10, 2.0);
    std::vector<int64_t> gathered(n);
    const int64_t mine = 7 * r;
    parallel::CollectiveHandle ha =
        world.all_reduce_sum_async(a.data(), a.size(), DType::f32, kHostStream);
    parallel::CollectiveHandle hb =
        world.all_reduce_sum_async(b.data(), b.size(), DType::f64, kHostStream);
    parallel::CollectiveHandle hg =
        world.all_gather_async(gathered.data(), &mine, 1, DType::i64, kHostStream);
    parallel::CollectiveHandle hbar = world.barrier_async();
    while (!hbar.test()) {
    }
    EXPECT_FALSE(hbar.pending());
    hg.wait();
    hb.wait();
    ha.wait();
    hb.wait();  // waiting twice is harmless
    const float want_a = static_cast<float>(n + n * (n - 1) / 2);
    for (float x : a) EXPECT_EQ(x, want_a);
    for (double x : b) EXPECT_EQ(x, 2.0 * n);
    for (int p = 0; p < n; ++p) EXPECT_EQ(gathered[p], 7 * p);
}

TEST(MpiCommunicator, CountersFollowNcclTestsSizes) {
    Communicator& world = mpi_world();
    const size_t n = static_cast<size_t>(world.size());
    world.reset_counters();
    std::vector<float> x(10 * n), y(10);
    world.all_reduce_sum(x.data(), x.size(), DType::f32, kHostStream);
    world.reduce_scatter_sum(y.data(), x.data(), 10, DType::f32, kHostStream);
    world.all_gather(x.data(), y.data(), 10, DType::f32, kHostStream);
    world.broadcast(y.data(), 10, DType::f32, 0, kHostStream);
    world.barrier();
    EXPECT_EQ(world.counters(CollectiveKind::all_reduce).payload_bytes, 40 * n);
    EXPECT_EQ(world.counters(CollectiveKind::reduce_scatter).payload_bytes, 40 * n);
    EXPECT_EQ(world.counters(CollectiveKind::all_gather).payload_bytes, 40 * n);
    EXPECT_EQ(world.counters(CollectiveKind::broadcast).payload_bytes, 40u);
    EXPECT_EQ(world.counters(CollectiveKind::barrier).calls, 1u);
    EXPECT_EQ(world.counters(CollectiveKind::all_reduce).calls, 1u);
}

// A ring of pipeline-style hand-offs: each rank posts its receive from the previous rank before
// its send to the next, two messages with different tags in flight per pair, completed in the
// reverse order of posting; payload and counters are checked. Needs two ranks.
TEST(MpiCommunicator, SendRecvHandsBuffersAlongARing) {
    Communicator& world = mpi_world();
    const int n = world.size(), r = world.rank();
    if (n < 2) GTEST_SKIP() << "point to point needs two ranks";
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    constexpr size_t kCount = 1000;
    std::vector<float> act(kCount), grad(kCount / 2), act_in(kCount, -1.0f),
        grad_in(kCount / 2, -1.0f);
    for (size_t i = 0; i < act.size(); ++i) act[i] = value_of(r, i);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = -value_of(r, i);
    world.reset_counters();
    parallel::CollectiveHandle recv_act =
        world.recv_async(act_in.data(), kCount, DType::f32, prev, 0, kHostStream);
    parallel::CollectiveHandle recv_grad =
        world.recv_async(grad_in.data(), kCount / 2, DType::f32, next, 1, kHostStream);
    parallel::CollectiveHandle send_grad =
        world.send_async(grad.data(), kCount / 2, DType::f32, prev, 1, kHostStream);
    parallel::CollectiveHandle send_act =
        world.send_async(act.data(), kCount, DType::f32, next, 0, kHostStream);
    send_act.wait();
    send_grad.wait();
    recv_grad.wait();
    recv_act.wait();
    for (size_t i = 0; i < act_in.size(); ++i) ASSERT_EQ(act_in[i], value_of(prev, i)) << i;
    for (size_t i = 0; i < grad_in.size(); ++i) ASSERT_EQ(grad_in[i], -value_of(next, i)) << i;
    EXPECT_EQ(world.counters(CollectiveKind::send_recv).calls, 4u);
    EXPECT_EQ(world.counters(CollectiveKind::send_recv).payload_bytes, 1500u * sizeof(float));
    // Sending to oneself is an error named after the group, raised before anything is posted.
    EXPECT_THROW((void)world.send_async(act.data(), 1, DType::f32, r, 0, kHostStream), Error);
}

TEST(MpiCommunicator, SplitMakesNamedGroups) {
    Communicator& world = mpi_world();
    const int n = world.size(), r = world.rank();
    // Even and odd ranks, ordered by descending world rank.
    auto half = world.split(r % 2, n - r, "parity");
    EXPECT_EQ(half->name(), "parity");
    const int members = r % 2 == 0 ? (n + 1) / 2 : n / 2;
    EXPECT_EQ(half->size(), members);
    EXPECT_EQ(half->progress_thread_active(), world.progress_thread_active());
    double sum = r;
    half->all_reduce_sum(&sum, 1, DType::f64, kHostStream);
    double want = 0;
    for (int p = r % 2; p < n; p += 2) want += p;
    EXPECT_EQ(sum, want);
    // key n - r puts the highest world rank first.
    int highest = r % 2;
    for (int p = r % 2; p < n; p += 2) highest = p;
    EXPECT_EQ(half->rank(), (highest - r) / 2);
    EXPECT_THROW(world.split(-1, 0, "bad"), Error);
}

TEST(MpiCommunicator, BadArgumentsAreErrorsNamingTheCollective) {
    Communicator& world = mpi_world();
    std::vector<uint16_t> h(4);
    try {
        world.all_reduce_sum(h.data(), h.size(), DType::bf16, kHostStream);
        ADD_FAILURE() << "bf16 sum accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("[all_reduce] group 'world'"), std::string::npos)
            << e.what();
    }
    // Host buffers only: a device stream is refused before anything is posted.
    int cuda_stream_object = 0;
    const Stream device{Device::cuda, &cuda_stream_object};
    std::vector<float> x(4, 1.0f);
    EXPECT_THROW(world.all_reduce_sum(x.data(), x.size(), DType::f32, device), Error);
    EXPECT_THROW((void)world.all_to_all_v_async(x.data(), std::vector<int>(world.size()),
                                                std::vector<int>(world.size()), x.data(),
                                                std::vector<int>(world.size()),
                                                std::vector<int>(world.size()), DType::f32, device),
                 Error);
    std::vector<int> too_few(static_cast<size_t>(world.size()) + 1);
    float dummy = 0;
    EXPECT_THROW(world.all_to_all_v(&dummy, too_few, too_few, &dummy, too_few, too_few, DType::f32,
                                    kHostStream),
                 Error);
    EXPECT_THROW(world.broadcast(&dummy, 1, DType::f32, world.size(), kHostStream), Error);
}

TEST(MpiCommunicator, CollectiveThatNeverCompletesTimesOut) {
    Communicator& world = mpi_world();
    if (world.size() == 1) GTEST_SKIP() << "needs a rank that stays away";
    parallel::CommunicatorOptions options;
    options.timeout_s = 0.3;
    auto impatient = parallel::make_mpi_world(mpi_session(), options);
    if (world.rank() != 0) {
        // Rank 0 joins only after everyone else has given up.
        try {
            impatient->barrier();
            ADD_FAILURE() << "the barrier finished without rank 0";
        } catch (const Error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("[barrier] group 'world' (rank " + std::to_string(world.rank()) +
                                " of " + std::to_string(world.size()) + "; world rank "),
                      std::string::npos)
                << what;
            EXPECT_NE(what.find("did not finish within 0.3 s"), std::string::npos) << what;
            // Rank 0 is waiting elsewhere, so it does not answer the liveness probe.
            EXPECT_TRUE(what.find("world rank 0 did not answer") != std::string::npos ||
                        what.find("world ranks 0,") != std::string::npos)
                << what;
        }
    }
    world.barrier();
    if (world.rank() == 0) impatient->barrier();  // completes the others' abandoned barrier
    world.barrier();
}

// Several collectives in flight (gradient buckets of an overlapped sync) when one times out: the
// exception unwinds past the other pending handles, which are abandoned rather than waited for
// (before, each waited a second timeout and then called std::terminate), and a later collective
// of the same world fails at once.
TEST(MpiCommunicator, PendingHandlesUnwoundPastATimeoutAreAbandoned) {
    Communicator& world = mpi_world();
    if (world.size() == 1) GTEST_SKIP() << "needs a rank that stays away";
    parallel::CommunicatorOptions options;
    options.timeout_s = 0.3;
    auto impatient = parallel::make_mpi_world(mpi_session(), options);
    std::vector<float> first_bucket(4, 1.0f), second_bucket(4, 1.0f);
    if (world.rank() != 0) {
        std::string what = "(no error)";
        try {
            parallel::CollectiveHandle first =
                impatient->all_reduce_sum_async(first_bucket.data(), 4, DType::f32, kHostStream);
            parallel::CollectiveHandle second =
                impatient->all_reduce_sum_async(second_bucket.data(), 4, DType::f32, kHostStream);
            first.wait();
        } catch (const Error& e) {
            what = e.what();
        }
        EXPECT_NE(what.find("did not finish within 0.3 s"), std::string::npos) << what;
        std::string again = "(no error)";
        try {
            impatient->barrier();
        } catch (const Error& e) {
            again = e.what();
        }
        EXPECT_NE(again.find("abandoned, since another collective of the job timed out"),
                  std::string::npos)
            << again;
    }
    world.barrier();
    if (world.rank() == 0) {  // completes the others' abandoned collectives
        impatient->all_reduce_sum(first_bucket.data(), 4, DType::f32, kHostStream);
        impatient->all_reduce_sum(second_bucket.data(), 4, DType::f32, kHostStream);
        impatient->barrier();
    }
    world.barrier();
}

// Everyone posts a large all_reduce, computes without touching MPI, then waits. With the progress
// thread the reduction advances during the computation; without it, mostly inside wait(). The
// times are printed (bench/bench_a2a measures them properly); only the sums are asserted.
TEST(MpiCommunicator, ProgressThreadAdvancesCollectivesDuringCompute) {
    Communicator& world = mpi_world();
    const int n = world.size(), r = world.rank();
    const size_t count = size_t{4} << 20;  // 16 MiB of floats
    for (bool progress : {false, true}) {
        parallel::CommunicatorOptions options;
        options.timeout_s = kMpiTestTimeoutS;
        options.progress_thread = progress;
        auto comm = parallel::make_mpi_world(mpi_session(), options);
        EXPECT_EQ(comm->progress_thread_active(), progress && mpi_session().thread_multiple());
        std::vector<float> data(count, static_cast<float>(r + 1));
        comm->barrier();
        const Timer total;
        parallel::CollectiveHandle h =
            comm->all_reduce_sum_async(data.data(), count, DType::f32, kHostStream);
        // About 0.3 s of arithmetic that the compiler cannot drop.
        const Timer compute;
        volatile double sink = 0;
        while (compute.elapsed_s() < 0.3) {
            double acc = 0;
            for (int i = 0; i < 100000; ++i) acc += std::sqrt(static_cast<double>(i));
            sink = sink + acc;
        }
        const Timer waiting;
        h.wait();
        const double wait_ms = waiting.elapsed_ms(), total_ms = total.elapsed_ms();
        if (r == 0)
            std::printf(
                "[progress] ranks=%d progress_thread=%d wait_after_compute=%.2f ms "
                "total=%.1f ms\n",
                n, progress ? 1 : 0, wait_ms, total_ms);
        const float want = static_cast<float>(n * (n + 1) / 2);
        size_t wrong = 0;
        for (float x : data) wrong += x != want;
        EXPECT_EQ(wrong, 0u);
    }
}

// A pipeline stage posts a gradient's receive long before its neighbour sends it. The progress
// thread must not poll such a receive every interval (on a CPU rank that took a fifth of a core):
// after sweeps that complete nothing it sleeps up to 16 intervals, so while one receive waits T
// seconds it sweeps at most a few times plus T / (16 intervals), however slow the machine (a
// sleep never ends early). Before the backoff: about T / interval sweeps.
TEST(MpiCommunicator, ProgressThreadBacksOffFromAReceiveThatWaitsForItsPeer) {
    Communicator& world = mpi_world();
    if (world.size() < 2) GTEST_SKIP() << "point to point needs two ranks";
    if (!mpi_session().thread_multiple()) GTEST_SKIP() << "no MPI_THREAD_MULTIPLE: no thread";
    MPI_Comm comm = MPI_COMM_NULL;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    const int rank = world.rank();
    constexpr int kTag = 7;
    int payload = 0;
    if (rank == 0) {
        constexpr double kIntervalS = 50e-6;
        parallel::MpiProgressEngine engine(/*run_thread=*/true, kIntervalS);
        auto op = std::make_shared<parallel::MpiOperation>();
        op->waits_for_peer = true;  // as MpiCommunicator::recv_async marks its receives
        ASSERT_EQ(MPI_Irecv(&payload, 1, MPI_INT, 1, kTag, comm, &op->request), MPI_SUCCESS);
        const Timer outstanding;
        engine.track(op);
        MPI_Barrier(comm);  // rank 1 sends only after this, then sleeps before it sends
        while (!op->done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const double waited_s = outstanding.elapsed_s();
        const double bound = 8 + waited_s / (PollBackoff::kDefaultMaxFactor * kIntervalS);
        EXPECT_EQ(payload, 42);
        EXPECT_LE(static_cast<double>(engine.sweeps()), bound)
            << "the receive waited " << waited_s * 1e3 << " ms";
    } else {
        MPI_Barrier(comm);
        if (rank == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            payload = 42;
            MPI_Send(&payload, 1, MPI_INT, 0, kTag, comm);
        }
    }
    MPI_Barrier(comm);
    MPI_Comm_free(&comm);
}

// A nonblocking collective advances a round on each test without completing: the thread keeps
// polling it at the base interval while it waits for a late rank (a backed-off thread delayed
// every round of the data-parallel gradient all-reduce by up to 16 intervals).
TEST(MpiCommunicator, ProgressThreadKeepsPollingACollectiveThatWaitsForALateRank) {
    Communicator& world = mpi_world();
    if (world.size() < 2) GTEST_SKIP() << "a late rank needs two ranks";
    if (!mpi_session().thread_multiple()) GTEST_SKIP() << "no MPI_THREAD_MULTIPLE: no thread";
    MPI_Comm comm = MPI_COMM_NULL;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    int value = 1;
    if (world.rank() == 0) {
        constexpr double kIntervalS = 50e-6;
        parallel::MpiProgressEngine engine(/*run_thread=*/true, kIntervalS);
        auto op = std::make_shared<parallel::MpiOperation>();
        ASSERT_EQ(MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_SUM, comm, &op->request),
                  MPI_SUCCESS);
        engine.track(op);
        while (!op->done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        EXPECT_EQ(value, world.size());
        EXPECT_LE(engine.longest_sleep_s(), kIntervalS) << "after " << engine.sweeps() << " sweeps";
    } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        // Nonblocking, as rank 0's: a blocking collective does not match a nonblocking one.
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_SUM, comm, &request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    MPI_Barrier(comm);
    MPI_Comm_free(&comm);
}

}  // namespace
}  // namespace moetron::testing
