// The parallel layer in one process: LocalCommunicator, and the flat dispatch over an EP group of
// one (the same code as under mpirun, tests/mpi/test_mpi_dispatch.cpp), with its error checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/profiling_backend.h"
#include "moetron/parallel/dispatch_flat.h"
#include "moetron/parallel/dispatch_two_tier.h"
#include "moetron/parallel/expert_dispatcher.h"
#include "moetron/parallel/local_communicator.h"
#include "moetron/parallel/tensor_parallel.h"
#include "mpi/dispatch_reference.h"

namespace moetron::parallel {
namespace {

using testing::DispatchCase;
using testing::Routing;

template <class F>
void expect_error_containing(F&& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one containing \"" << needle << "\"";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "message: " << e.what() << "\nexpected to contain: " << needle;
    }
}

TEST(ParallelLocal, CollectivesOfAWorldOfOne) {
    LocalCommunicator world;
    EXPECT_EQ(world.rank(), 0);
    EXPECT_EQ(world.size(), 1);
    EXPECT_EQ(world.name(), "world");
    std::vector<float> x = {1, 2, 3};
    world.all_reduce_sum(std::span<float>(x), kHostStream);
    EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
    std::vector<float> y(3);
    world.reduce_scatter_sum(y.data(), x.data(), 3, DType::f32, kHostStream);
    EXPECT_EQ(y, x);
    std::vector<double> g(2);
    const std::vector<double> mine = {4, 5};
    world.all_gather(std::span<double>(g), std::span<const double>(mine), kHostStream);
    EXPECT_EQ(g, mine);
    std::vector<int> c = {2}, d = {1};
    std::vector<float> r(3, 0);
    world.all_to_all_v(r.data(), c, d, x.data(), c, std::vector<int>{0}, kHostStream);
    EXPECT_EQ(r, (std::vector<float>{0, 1, 2}));
    world.broadcast(x.data(), 3, DType::f32, 0, kHostStream);
    world.barrier();
    CollectiveHandle h = world.barrier_async();
    EXPECT_FALSE(h.pending());
    EXPECT_TRUE(h.test());

    EXPECT_EQ(world.counters(CollectiveKind::all_reduce).payload_bytes, 12u);
    EXPECT_EQ(world.counters(CollectiveKind::all_to_all).payload_bytes, 8u);
    EXPECT_EQ(world.counters(CollectiveKind::all_to_all).peer_bytes, 0u);
    EXPECT_EQ(world.counters(CollectiveKind::barrier).calls, 2u);
    world.reset_counters();
    EXPECT_EQ(world.counters(CollectiveKind::barrier).calls, 0u);

    auto child = world.split(0, 0, "ep");
    EXPECT_EQ(child->name(), "ep");
    expect_error_containing([&] { world.split(-1, 0, "x"); }, "color must be >= 0");
    expect_error_containing([&] { world.broadcast(x.data(), 3, DType::f32, 1, kHostStream); },
                            "root 1 is not in [0, 1)");
    expect_error_containing([&] { world.all_reduce_sum(x.data(), 3, DType::i32, kHostStream); },
                            "[all_reduce] group 'world': sums are supported for F32 and F64");
    std::vector<int> two = {1, 1};
    expect_error_containing(
        [&] { world.all_to_all_v(r.data(), two, two, x.data(), two, two, kHostStream); },
        "group 'world' has 1 ranks but got 2 recv counts");
    std::vector<float> small(1);
    expect_error_containing(
        [&] { world.all_gather(std::span<float>(small), std::span<const float>(x), kHostStream); },
        "output holds 1 elements, needs 3");
    EXPECT_EQ(collective_name(CollectiveKind::all_to_all), "all_to_all_v");
    // Point to point needs another rank: a group of one has none.
    expect_error_containing(
        [&] { (void)world.send_async(x.data(), 3, DType::f32, 0, 0, kHostStream); },
        "peer 0 is not another rank of the group");
    expect_error_containing(
        [&] { (void)world.recv_async(x.data(), 3, DType::f32, 1, 0, kHostStream); },
        "peer 1 is not another rank");
    EXPECT_EQ(collective_name(CollectiveKind::send_recv), "send_recv");
}

// A device stream with host buffers is an internal error, whichever collective gets it.
TEST(ParallelLocal, CollectivesRefuseADeviceStream) {
    LocalCommunicator world("world");
    int cuda_stream_object = 0;
    const Stream device{Device::cuda, &cuda_stream_object};
    std::vector<float> x = {1, 2, 3}, y(3);
    std::vector<int> one = {3}, zero = {0};
    expect_error_containing([&] { world.all_reduce_sum(x.data(), 3, DType::f32, device); },
                            "[all_reduce] group 'world': a device stream");
    expect_error_containing(
        [&] { world.reduce_scatter_sum(y.data(), x.data(), 3, DType::f32, device); },
        "[reduce_scatter] group 'world': a device stream");
    expect_error_containing([&] { world.all_gather(y.data(), x.data(), 3, DType::f32, device); },
                            "[all_gather] group 'world': a device stream");
    expect_error_containing(
        [&] { world.all_to_all_v(y.data(), one, zero, x.data(), one, zero, DType::f32, device); },
        "[all_to_all_v] group 'world': a device stream");
    expect_error_containing([&] { world.broadcast(x.data(), 3, DType::f32, 0, device); },
                            "[broadcast] group 'world': a device stream");
    EXPECT_THROW((void)world.all_reduce_sum_async(x.data(), 3, DType::f32, device), Error);
    world.all_reduce_sum(x.data(), 3, DType::f32, kHostStream);  // a host stream is fine
}

void run_local_case(const DispatchCase& c) {
    LocalCommunicator ep("ep");
    const DispatchConfig cfg = testing::config_for(c);
    DispatchBuffer buffer(cfg, 1, cpu_backend());
    DispatchLayout layout(cfg, 1, 0, cpu_backend());
    const testing::DispatchResult got = testing::run_dispatch(c, ep, layout, buffer);
    testing::expect_matches_reference(got, testing::reference_result(c, 0, 1),
                                      testing::analytic_bytes(c, 0, 1, false), c.name);
}

TEST(ParallelLocalDispatch, MatchesReferenceOnOneRank) {
    DispatchCase c;
    c.name = "local_random";
    c.tokens_per_rank = {19};
    run_local_case(c);
    c.name = "local_one_expert";
    c.top_k = 1;
    c.routing = Routing::first_experts;
    run_local_case(c);
    c.name = "local_zero_tokens";
    c.tokens_per_rank = {0};
    run_local_case(c);
    c.name = "local_k8";
    c.top_k = 8;
    c.routing = Routing::random;
    c.tokens_per_rank = {5};
    run_local_case(c);
}

// The layout on its own: counts and expert segments for a hand-checked routing.
TEST(ParallelLocalDispatch, LayoutOfAKnownRouting) {
    LocalCommunicator ep("ep");
    DispatchConfig cfg;
    cfg.num_experts = 4;
    cfg.top_k = 2;
    cfg.hidden = 1;
    cfg.max_tokens = 3;
    DispatchLayout layout(cfg, 1, 0, cpu_backend());
    DispatchBuffer buffer(cfg, 1, cpu_backend());
    const std::vector<int32_t> ids = {2, 0, 0, 3, 2, 1};  // tokens 0, 1, 2
    const std::vector<float> weights(6, 1.0f);
    dispatch_layout(layout, ids.data(), weights.data(), 3, buffer, ep);
    EXPECT_EQ(layout.num_recv_rows(), 6);
    EXPECT_EQ(std::vector<int64_t>(layout.expert_offsets().begin(), layout.expert_offsets().end()),
              (std::vector<int64_t>{0, 2, 3, 5, 6}));
    // Each token once to its one rank, however many of its experts live there.
    EXPECT_EQ(
        std::vector<int>(layout.send_rows_per_rank().begin(), layout.send_rows_per_rank().end()),
        (std::vector<int>{3}));
    EXPECT_EQ(layout.spread().rank_sum, 3);
    EXPECT_EQ(layout.spread().domain_max, 1);

    // Copies sorted by expert, stable: e0 <- tokens 0, 1; e1 <- 2; e2 <- 0, 2; e3 <- 1.
    const std::vector<float> x = {10, 20, 30};
    std::vector<float> expert_inp(static_cast<size_t>(cfg.capacity_rows(1)));
    dispatch_forward(expert_inp.data(), x.data(), layout, buffer, ep);
    EXPECT_EQ(std::vector<float>(expert_inp.begin(), expert_inp.begin() + 6),
              (std::vector<float>{10, 20, 30, 10, 30, 20}));
    EXPECT_EQ(buffer.bytes_sent().intra_domain + buffer.bytes_sent().inter_domain, 0u);
}

TEST(ParallelLocalDispatch, ConfigErrorsSayWhich) {
    DispatchConfig cfg;
    cfg.num_experts = 6;
    cfg.top_k = 2;
    cfg.hidden = 8;
    cfg.max_tokens = 4;
    EXPECT_NO_THROW(cfg.validate(3));
    expect_error_containing([&] { cfg.validate(4); },
                            "the 6 experts do not split evenly over an EP group of 4 ranks");
    DispatchConfig k = cfg;
    k.top_k = 7;
    expect_error_containing([&] { k.validate(1); }, "top_k 7 is not in [1, 6]");
    DispatchConfig big = cfg;
    big.max_tokens = 1 << 20;
    big.hidden = 7168;
    expect_error_containing([&] { big.validate(1); }, "exceed MPI's int count limit");
    DispatchConfig d = cfg;
    d.hidden = 0;
    expect_error_containing([&] { d.validate(1); }, "hidden must be >= 1");
    // Worst case: every rank sends every token's copies on this rank's min(K, El) experts.
    EXPECT_EQ(cfg.worst_case_recv_rows(3), 3 * 4 * 2);
    EXPECT_EQ(cfg.worst_case_recv_rows(6), 6 * 4 * 1);
    // One send row per token and destination rank (min(K, ep) per token); the staging rows hold
    // every source token once at worst.
    const ArenaPlan plan = DispatchBuffer::plan(cfg, 3);
    EXPECT_EQ(plan.entries()[plan.index_of("ep.send_rows")].size_bytes, 4u * 2 * 8 * 4);
    EXPECT_EQ(plan.entries()[plan.index_of("ep.recv_rows")].size_bytes, 3u * 4 * 8 * 4);
    DispatchConfig split = cfg;
    split.domain_size = 4;
    expect_error_containing([&] { split.validate(6); },
                            "an EP group of 6 ranks does not split into whole domains of 4");
}

TEST(ParallelLocalDispatch, BadRoutingAndSizesAreErrors) {
    LocalCommunicator ep("ep");
    DispatchConfig cfg;
    cfg.num_experts = 4;
    cfg.top_k = 2;
    cfg.hidden = 3;
    cfg.max_tokens = 2;
    DispatchLayout layout(cfg, 1, 0, cpu_backend());
    DispatchBuffer buffer(cfg, 1, cpu_backend());
    const std::vector<float> w(6, 0.5f);
    const std::vector<int32_t> bad = {0, 1, 2, 4};
    expect_error_containing([&] { dispatch_layout(layout, bad.data(), w.data(), 2, buffer, ep); },
                            "expert id 4 of token 1 (choice 1) is not in [0, 4)");
    const std::vector<int32_t> ok = {0, 1, 2, 3, 0, 1};
    expect_error_containing([&] { dispatch_layout(layout, ok.data(), w.data(), 3, buffer, ep); },
                            "3 tokens, but the layout holds at most max_tokens = 2");

    DispatchConfig tight = cfg;
    tight.pair_capacity_rows = 3;
    DispatchLayout small(tight, 1, 0, cpu_backend());
    DispatchBuffer small_buffer(tight, 1, cpu_backend());
    expect_error_containing(
        [&] { dispatch_layout(small, ok.data(), w.data(), 2, small_buffer, ep); },
        "rank 0 sends 4 rows to EP rank 0, more than the 3 planned");

    // A buffer planned for other shapes is refused before any data moves.
    dispatch_layout(layout, ok.data(), w.data(), 2, buffer, ep);
    DispatchConfig other = cfg;
    other.hidden = 5;
    DispatchBuffer wrong(other, 1, cpu_backend());
    std::vector<float> x(6), y(24);
    expect_error_containing([&] { dispatch_forward(y.data(), x.data(), layout, wrong, ep); },
                            "does not fit the layout");
}

// The expert-side buffers from the capacity factor, at DeepSeek-V3 scale (E 256, K 8, ep 64,
// 4096 tokens per rank): the balanced load is 4096 * 8 / 64 = 512 rows from each rank to each
// rank, 32,768 per rank; the worst case 4096 * min(8, 4) = 16,384 from each, 1,048,576 per rank.
TEST(MoeCapacity, PlannedFromTheBalancedLoadTimesTheFactor) {
    ExpertDispatchConfig c;
    c.routing.num_experts = 256;
    c.routing.top_k = 8;
    c.routing.hidden = 7168;
    c.routing.max_tokens = 4096;
    c.capacity_factor = 2.0;
    EXPECT_EQ(pair_rows_for_capacity_factor(c, 64), 1024);
    DispatchConfig d = c.routing;
    EXPECT_EQ(d.capacity_rows(64), 1048576);  // 0: the worst case
    EXPECT_FALSE(d.can_overflow(64));
    d = planned_routing(c, 64);
    EXPECT_EQ(d.pair_capacity_rows, 1024);
    EXPECT_EQ(planned_expert_rows(c, 64), 65536);
    EXPECT_EQ(d.capacity_rows(64), 65536);
    EXPECT_TRUE(d.can_overflow(64));
    // The flat hop receives each source's tokens once, within the budget; the two-tier rail hop
    // (8 domains of 8) within the budget towards the domain's 8 ranks.
    EXPECT_EQ(flat_hops(d, 64, 0)[0].max_recv, 64 * 1024);
    d.domain_size = 8;
    const std::vector<HopSpec> two = two_tier_hops(d, 64, 0);
    EXPECT_EQ(two[0].max_recv, 8 * 4096);  // min(4096, 8 * 1024) from each of 8 rail peers
    EXPECT_EQ(two[1].max_recv, 64 * 1024);

    // Never below one token's copies on a rank, never above the worst case (0 then: one round).
    c.capacity_factor = 1e-6;
    EXPECT_EQ(pair_rows_for_capacity_factor(c, 64), 4);
    c.capacity_factor = 100;
    EXPECT_EQ(pair_rows_for_capacity_factor(c, 64), 0);
    c.capacity_factor = 0;
    EXPECT_EQ(pair_rows_for_capacity_factor(c, 64), 0);
    c.capacity_factor = -1;
    expect_error_containing([&] { pair_rows_for_capacity_factor(c, 64); },
                            "capacity factor must be a finite number >= 0");
}

// Rounds in token order, each as long as no rank gets more than the budget; a rank's copies of
// one token count once per expert.
TEST(MoeCapacity, RoutingSplitsIntoRoundsWithinThePairBudget) {
    DispatchConfig d;
    d.num_experts = 4;  // 2 ranks of 2 experts
    d.top_k = 2;
    d.hidden = 1;
    d.max_tokens = 6;
    d.pair_capacity_rows = 3;
    // Rows to rank 0 per token: 2, 1, 0, 2, 1, 1 (rank 1: 0, 1, 2, 0, 1, 1): token 3 would bring
    // rank 0 to 5 rows, token 5 (in the next round) to 4, so each opens a round.
    const std::vector<int32_t> ids = {0, 1, 0, 2, 2, 3, 1, 0, 0, 3, 1, 2};
    std::vector<int64_t> ends(6), rows(2);
    EXPECT_EQ(split_into_rounds(ends, rows, ids.data(), 6, d, 2, cpu_backend()), 3);
    EXPECT_EQ(std::vector<int64_t>(ends.begin(), ends.begin() + 3),
              (std::vector<int64_t>{3, 5, 6}));
    // A budget that holds everything (7 rows to rank 0): one round; no tokens: one empty round.
    d.pair_capacity_rows = 7;
    EXPECT_EQ(split_into_rounds(ends, rows, ids.data(), 6, d, 2, cpu_backend()), 1);
    EXPECT_EQ(ends[0], 6);
    EXPECT_EQ(split_into_rounds(ends, rows, ids.data(), 0, d, 2, cpu_backend()), 1);
    EXPECT_EQ(ends[0], 0);
}

// With one rank every expert is here, the buffers hold every copy: one round, no collective.
TEST(MoeCapacity, OneRankRoutesInOneRound) {
    ExpertDispatchConfig c;
    c.routing.num_experts = 4;
    c.routing.top_k = 2;
    c.routing.hidden = 1;
    c.routing.max_tokens = 3;
    c.num_slots = 1;
    c.capacity_factor = 0.1;
    const auto d = make_expert_dispatcher(c, {}, cpu_backend());
    const std::vector<int32_t> ids = {0, 1, 0, 1, 0, 1};
    const std::span<const int64_t> rounds = d->plan_rounds(0, ids.data(), 3);
    ASSERT_EQ(rounds.size(), 1u);
    EXPECT_EQ(rounds[0], 3);
    EXPECT_EQ(d->capacity_rows(), 6);
}

// Without tensor parallelism the operators that move rows between buffers still move them, through
// the backend (which owns the memory, host or device), not a host loop.
TEST(TensorParallelOneRank, CopiesThroughTheBackend) {
    ProfilingBackend backend;
    const TensorParallel tp(nullptr, backend);
    const std::vector<float> rows = {1, 2, 3};
    std::vector<float> full(3, 0.0f);
    tp.all_gather(full.data(), rows.data(), 3);
    EXPECT_EQ(full, rows);
    std::vector<float> back(3, 0.0f);
    tp.reduce_scatter_rows(back.data(), full.data(), 3);
    EXPECT_EQ(back, rows);
    EXPECT_EQ(backend.calls("copy"), 2);
}

}  // namespace
}  // namespace moetron::parallel
