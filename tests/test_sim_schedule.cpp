// sim/schedule: the pipeline event simulation reproduces the textbook bubbles of 1F1B and
// interleaved 1F1B with equal task times, and its task order is Megatron-LM's.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "moetron/core/error.h"
#include "moetron/sim/schedule.h"

namespace moetron::sim {
namespace {

ScheduleInput uniform(int64_t pp, int64_t vpp, int64_t m, double tf, double tb) {
    ScheduleInput in;
    in.pp = pp;
    in.vpp = vpp;
    in.micro_batches = m;
    in.forward_s = [tf](int64_t) { return tf; };
    in.backward_s = [tb](int64_t) { return tb; };
    in.forward_backward_s = [tf, tb](int64_t, int64_t) { return tf + tb; };
    return in;
}

TEST(SimSchedule, OneF1BBubbleIsPMinusOneTaskPairs) {
    // 1F1B with equal stages: makespan = (m + p - 1) (tf + tb) (Narayanan et al., 2021).
    for (int64_t pp : {1, 2, 4, 8}) {
        for (int64_t m : {8, 16, 33}) {
            const ScheduleResult r = run_schedule(uniform(pp, 1, m, 1.0, 2.0));
            EXPECT_NEAR(r.makespan_s, static_cast<double>(m + pp - 1) * 3.0, 1e-9)
                << "pp " << pp << " m " << m;
            for (double busy : r.busy_s) EXPECT_NEAR(busy, static_cast<double>(m) * 3.0, 1e-9);
        }
    }
}

TEST(SimSchedule, InterleavingDividesTheBubbleByVpp) {
    // Interleaved 1F1B: each chunk is 1/v of a stage, so the bubble is (p - 1)(tf + tb) / v.
    const int64_t pp = 4, m = 16;
    for (int64_t vpp : {2, 4}) {
        const double tf = 1.0 / static_cast<double>(vpp), tb = 2.0 / static_cast<double>(vpp);
        const ScheduleResult r = run_schedule(uniform(pp, vpp, m, tf, tb));
        const double ideal = static_cast<double>(m) * 3.0;
        const double bubble = static_cast<double>(pp - 1) * 3.0 / static_cast<double>(vpp);
        EXPECT_NEAR(r.makespan_s, ideal + bubble, 1e-9) << "vpp " << vpp;
    }
}

TEST(SimSchedule, EveryTaskRunsOnceAndAfterItsInputs) {
    for (bool merge : {false, true}) {
        ScheduleInput in = uniform(4, 2, 8, 1.0, 2.0);
        in.merge_steady_state = merge;
        in.p2p_s = 0.25;
        const ScheduleResult r = run_schedule(in);
        std::set<std::tuple<int64_t, int64_t, bool>> seen;
        for (const auto& stage : r.stages) {
            for (const ScheduledTask& t : stage) {
                if (t.kind != TaskKind::backward) {
                    EXPECT_TRUE(seen.insert({t.chunk_f, t.micro_f, true}).second);
                }
                if (t.kind != TaskKind::forward) {
                    EXPECT_TRUE(seen.insert({t.chunk_b, t.micro_b, false}).second);
                }
            }
        }
        EXPECT_EQ(seen.size(), static_cast<size_t>(2 * 8 * 8)) << "merge " << merge;
        // A forward starts after the previous chunk's forward of its micro-batch plus the p2p
        // time; a backward after the next chunk's backward (or its own forward at the end).
        std::map<std::pair<int64_t, int64_t>, double> f_end, b_end;
        for (const auto& stage : r.stages) {
            for (const ScheduledTask& t : stage) {
                if (t.kind != TaskKind::backward) f_end[{t.chunk_f, t.micro_f}] = t.end_s;
                if (t.kind != TaskKind::forward) b_end[{t.chunk_b, t.micro_b}] = t.end_s;
            }
        }
        const int64_t chunks = 8;
        for (const auto& stage : r.stages) {
            for (const ScheduledTask& t : stage) {
                if (t.kind != TaskKind::backward && t.chunk_f > 0) {
                    EXPECT_GE(t.start_s,
                              f_end[std::make_pair(t.chunk_f - 1, t.micro_f)] + 0.25 - 1e-9);
                }
                if (t.kind != TaskKind::forward) {
                    const double after =
                        t.chunk_b == chunks - 1
                            ? f_end[std::make_pair(t.chunk_b, t.micro_b)]
                            : b_end[std::make_pair(t.chunk_b + 1, t.micro_b)] + 0.25;
                    EXPECT_GE(t.start_s, after - 1e-9);
                }
            }
        }
        // p2p latency can only lengthen the schedule.
        const ScheduleResult no_p2p = run_schedule(uniform(4, 2, 8, 1.0, 2.0));
        EXPECT_GE(r.makespan_s, no_p2p.makespan_s);
    }
}

TEST(SimSchedule, OrderFollowsMegatronWarmup) {
    // Stage 0 of pp 4, vpp 2: warm-up 2*(4-0-1) + (2-1)*4 = 10 forwards, chunks 0,0,0,0,1,1,...
    const auto order = stage_order(0, 4, 2, 8, false);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(order[i].kind, TaskKind::forward) << i;
    EXPECT_EQ(order[0].chunk_f, 0);
    EXPECT_EQ(order[4].chunk_f, 4);  // local chunk 1 of stage 0 = global chunk 1 * pp + 0
    EXPECT_EQ(order[8].chunk_f, 0);
    EXPECT_EQ(order[8].micro_f, 4);
    // Then 1F1B: forward 10, backward 0 (of the last local chunk), ...
    EXPECT_EQ(order[10].kind, TaskKind::forward);
    EXPECT_EQ(order[11].kind, TaskKind::backward);
    EXPECT_EQ(order[11].chunk_b, 4);
    EXPECT_EQ(order[11].micro_b, 0);
}

TEST(SimSchedule, CombinedForwardBackwardKeepsTheBubbleSmall) {
    // Merging steady-state pairs (for EP overlap) runs one extra forward in the warm-up; with
    // equal task times the makespan stays within one task pair of interleaved 1F1B's.
    const int64_t pp = 4, vpp = 2, m = 16;
    ScheduleInput plain = uniform(pp, vpp, m, 0.5, 1.0);
    ScheduleInput merged = plain;
    merged.merge_steady_state = true;
    const double a = run_schedule(plain).makespan_s, b = run_schedule(merged).makespan_s;
    EXPECT_LE(b, a + 1.5 + 1e-9);
    EXPECT_GE(b, static_cast<double>(m) * 1.5 * static_cast<double>(vpp) - 1e-9);
}

TEST(SimSchedule, InterleavingNeedsMicroBatchesInMultiplesOfPp) {
    EXPECT_THROW(run_schedule(uniform(4, 2, 6, 1.0, 2.0)), Error);
}

}  // namespace
}  // namespace moetron::sim

namespace moetron::sim {
namespace {

// Peak micro-batches holding activations on a stage: a forward adds one, the task that frees
// its activations (W with zero bubble, B otherwise) removes one.
int64_t peak_in_flight(const std::vector<ScheduledTask>& order) {
    int64_t cur = 0, peak = 0;
    for (const ScheduledTask& t : order) {
        if (t.kind == TaskKind::forward) peak = std::max(peak, ++cur);
        if (t.kind == TaskKind::backward) --cur;
    }
    return peak;
}

TEST(SimSchedule, ZeroBubbleH1FillsTheCoolDownWithWeightGradients) {
    // Qi et al. (ICLR 2024), F = B = W: ZB-H1's bubble is (p-1)(F+B-W), 1F1B's (p-1)(F+B+W).
    for (int64_t pp : {2, 4, 8}) {
        for (int64_t m : {8, 16, 24}) {
            ScheduleInput zb = uniform(pp, 1, m, 1.0, 1.0);
            zb.schedule = PipelineSchedule::zero_bubble_h1;
            zb.weight_gradient_s = [](int64_t) { return 1.0; };
            const ScheduleResult r = run_schedule(zb);
            const double work = 3.0 * static_cast<double>(m);
            EXPECT_NEAR(r.makespan_s, work + static_cast<double>(pp - 1), 1e-9)
                << "pp " << pp << " m " << m;
            const ScheduleResult plain = run_schedule(uniform(pp, 1, m, 1.0, 2.0));
            EXPECT_NEAR(plain.makespan_s, work + 3.0 * static_cast<double>(pp - 1), 1e-9);
            // The same activation memory as 1F1B on every stage.
            for (int64_t s = 0; s < pp; ++s) {
                EXPECT_EQ(peak_in_flight(r.stages[s]), peak_in_flight(plain.stages[s]))
                    << "pp " << pp << " stage " << s;
            }
        }
    }
    ScheduleInput interleaved = uniform(4, 2, 8, 1.0, 1.0);
    interleaved.schedule = PipelineSchedule::zero_bubble_h1;
    EXPECT_THROW(run_schedule(interleaved), Error);
    EXPECT_THROW(pipeline_schedule_from_name("gpipe"), Error);
}

}  // namespace
}  // namespace moetron::sim

namespace moetron::sim {
namespace {

TEST(SimSchedule, DualPipeBubbleIsTheReportsFormula) {
    // DeepSeek-V3 report, Table 2: (PP/2 - 1)(F&B + B - 3W) on top of m F&B chunks.
    EXPECT_DOUBLE_EQ(dualpipe_makespan_s(8, 20, 3.0, 1.0, 0.5), 20 * 3.0 + 3 * (3.0 + 1.0 - 1.5));
    EXPECT_DOUBLE_EQ(dualpipe_makespan_s(2, 4, 3.0, 1.0, 0.5), 12.0);  // no bubble at pp 2
    // Against 1F1B's (p-1)(F+B) with F = 1, B = 1 + W, W = 1 and F&B = F + B + W = 3: a
    // quarter of the bubble, plus the all-to-all hidden inside F&B in real runs.
    const double one_f_one_b_bubble = 7 * 3.0;
    const double dualpipe_bubble = dualpipe_makespan_s(8, 20, 3.0, 1.0, 1.0) - 20 * 3.0;
    EXPECT_DOUBLE_EQ(dualpipe_bubble, 3 * 1.0);
    EXPECT_LT(dualpipe_bubble, one_f_one_b_bubble / 4);
    EXPECT_THROW(dualpipe_makespan_s(3, 8, 3.0, 1.0, 1.0), Error);
}

}  // namespace
}  // namespace moetron::sim
