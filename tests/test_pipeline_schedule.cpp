// train/pipeline_schedule: each stage's order of forwards and backwards. Every schedule is run on
// a model of the pipeline (every stage executes its order; a forward waits for the previous
// virtual stage's forward of the micro-batch, a backward for the next one's backward, or its own
// forward on the last virtual stage): all actions must complete, so the orders of the stages fit
// together without a deadlock, and the activations in flight stay within each schedule's bound.
// A split backward's B counts as the backward (its W waits for nobody but its own B).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/sim/schedule.h"
#include "moetron/train/pipeline_schedule.h"

namespace moetron {
namespace {

using Op = PipelineAction::Op;

bool is_backward(Op op) {
    return op == Op::backward || op == Op::backward_input;
}

// Runs every stage's order in lock step rounds; returns false on a deadlock.
bool completes(PipelineScheduleKind kind, int64_t pp, int64_t vpp, int64_t m) {
    std::vector<std::vector<PipelineAction>> orders;
    for (int64_t s = 0; s < pp; ++s) orders.push_back(pipeline_order(kind, pp, s, m, vpp));
    std::vector<size_t> next(static_cast<size_t>(pp), 0);
    std::set<std::tuple<Op, int64_t, int64_t>> done;  // (op, virtual stage, micro-batch)
    const int64_t last_virtual = pp * vpp - 1;
    for (bool progress = true; progress;) {
        progress = false;
        std::vector<std::tuple<Op, int64_t, int64_t>> finished;
        for (int64_t s = 0; s < pp; ++s) {
            if (next[s] == orders[s].size()) continue;
            const PipelineAction& a = orders[s][next[s]];
            const int64_t v = a.chunk * pp + s;
            const bool ready =
                a.op == Op::backward_weight || a.op == Op::forward
                    ? (v == 0 || done.count({Op::forward, v - 1, a.micro_batch}) > 0)
                    : (v == last_virtual ? done.count({Op::forward, v, a.micro_batch}) > 0
                                         : done.count({Op::backward, v + 1, a.micro_batch}) > 0);
            if (!ready) continue;
            finished.emplace_back(is_backward(a.op) ? Op::backward : a.op, v, a.micro_batch);
            ++next[s];
            progress = true;
        }
        done.insert(finished.begin(), finished.end());
    }
    for (int64_t s = 0; s < pp; ++s)
        if (next[s] != orders[s].size()) return false;
    return true;
}

void expect_each_action_once(const std::vector<PipelineAction>& order, int64_t m, int64_t vpp) {
    std::map<std::pair<int64_t, int64_t>, int> forwards, backwards, weights;
    std::vector<int64_t> last_forward(static_cast<size_t>(vpp), -1),
        last_backward(static_cast<size_t>(vpp), -1);
    for (const PipelineAction& a : order) {
        const auto key = std::pair{a.chunk, a.micro_batch};
        if (a.op == Op::backward_weight) {
            EXPECT_EQ(backwards[key], 1) << "W before its B";
            EXPECT_EQ(++weights[key], 1) << "W twice";
        } else if (a.op == Op::forward) {
            ++forwards[key];
            EXPECT_EQ(a.micro_batch, last_forward[a.chunk] + 1) << "forwards in order per chunk";
            last_forward[a.chunk] = a.micro_batch;
        } else {
            EXPECT_EQ(forwards[key], 1) << "backward before its forward";
            ++backwards[key];
            EXPECT_EQ(a.micro_batch, last_backward[a.chunk] + 1) << "backwards in order per chunk";
            last_backward[a.chunk] = a.micro_batch;
        }
    }
    EXPECT_EQ(static_cast<int64_t>(forwards.size()), m * vpp);
    EXPECT_EQ(static_cast<int64_t>(backwards.size()), m * vpp);
    const bool split = std::any_of(order.begin(), order.end(), [](const PipelineAction& a) {
        return a.op == Op::backward_weight;
    });
    if (split) {
        EXPECT_EQ(static_cast<int64_t>(weights.size()), m * vpp);
    }
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternates) {
    // Stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then F B pairs, then 3 backwards.
    const std::vector<PipelineAction> order =
        pipeline_order(PipelineScheduleKind::one_f_one_b, 4, 0, 6);
    const std::vector<PipelineAction> want = {
        {Op::forward, 0},  {Op::forward, 1},  {Op::forward, 2},  {Op::forward, 3},
        {Op::backward, 0}, {Op::forward, 4},  {Op::backward, 1}, {Op::forward, 5},
        {Op::backward, 2}, {Op::backward, 3}, {Op::backward, 4}, {Op::backward, 5}};
    EXPECT_EQ(order, want);
    // The last stage alternates from the start: one micro-batch in flight.
    EXPECT_EQ(max_in_flight(pipeline_order(PipelineScheduleKind::one_f_one_b, 4, 3, 6)), 1);
    for (int64_t s = 0; s < 4; ++s) {
        const auto o = pipeline_order(PipelineScheduleKind::one_f_one_b, 4, s, 6);
        expect_each_action_once(o, 6, 1);
        EXPECT_EQ(max_in_flight(o), 4 - s) << "stage " << s;
    }
    // Fewer micro-batches than stages: every forward first.
    EXPECT_EQ(max_in_flight(pipeline_order(PipelineScheduleKind::one_f_one_b, 4, 0, 2)), 2);
}

TEST(PipelineSchedule, StagesFitTogetherWithoutDeadlock) {
    for (int64_t pp : {2, 3, 4})
        for (int64_t m : {1, 2, 3, 5, 8})
            EXPECT_TRUE(completes(PipelineScheduleKind::one_f_one_b, pp, 1, m))
                << "1f1b pp " << pp << " m " << m;
    for (int64_t pp : {2, 4})
        for (int64_t vpp : {2, 3})
            for (int64_t m : {pp, 2 * pp, 3 * pp})
                EXPECT_TRUE(completes(PipelineScheduleKind::interleaved, pp, vpp, m))
                    << "interleaved pp " << pp << " vpp " << vpp << " m " << m;
    for (int64_t pp : {2, 3, 4})
        for (int64_t m : {1, 2, 3, 5, 8})
            EXPECT_TRUE(completes(PipelineScheduleKind::zero_bubble_h1, pp, 1, m))
                << "zb-h1 pp " << pp << " m " << m;
}

TEST(PipelineSchedule, ZeroBubbleFillsTheCoolDownWithWeightGradients) {
    // pp 4, 8 micro-batches, stage 0: 1F1B's F and B; the first W once pp - 1 = 3 are queued,
    // then in the cool-down two W's between B's, where 1F1B's stage 0 waits.
    using A = PipelineAction;
    const std::vector<PipelineAction> want = {
        A{Op::forward, 0},         A{Op::forward, 1},        A{Op::forward, 2},
        A{Op::forward, 3},         A{Op::backward_input, 0}, A{Op::forward, 4},
        A{Op::backward_input, 1},  A{Op::forward, 5},        A{Op::backward_input, 2},
        A{Op::forward, 6},         A{Op::backward_input, 3}, A{Op::backward_weight, 0},
        A{Op::forward, 7},         A{Op::backward_input, 4}, A{Op::backward_weight, 1},
        A{Op::backward_weight, 2}, A{Op::backward_input, 5}, A{Op::backward_weight, 3},
        A{Op::backward_weight, 4}, A{Op::backward_input, 6}, A{Op::backward_weight, 5},
        A{Op::backward_weight, 6}, A{Op::backward_input, 7}, A{Op::backward_weight, 7}};
    EXPECT_EQ(pipeline_order(PipelineScheduleKind::zero_bubble_h1, 4, 0, 8), want);
    for (int64_t pp : {2, 4})
        for (int64_t m : {1, 3, 5, 8})
            for (int64_t s = 0; s < pp; ++s) {
                const auto zb = pipeline_order(PipelineScheduleKind::zero_bubble_h1, pp, s, m);
                expect_each_action_once(zb, m, 1);
                // 1F1B's activations in flight; at most pp weight gradients queued.
                EXPECT_EQ(max_in_flight(zb), max_in_flight(pipeline_order(
                                                 PipelineScheduleKind::one_f_one_b, pp, s, m)));
                EXPECT_LE(max_weight_gradients_pending(zb), pp);
                EXPECT_GE(max_weight_gradients_pending(zb), 1);
            }
    EXPECT_EQ(
        max_weight_gradients_pending(pipeline_order(PipelineScheduleKind::one_f_one_b, 4, 0, 8)),
        0);
}

// The engine's zb-h1 is the cluster model's: with unit costs and free transfers, every stage runs
// its tasks in the order sim::run_schedule places them.
TEST(PipelineSchedule, ZeroBubbleOrderIsTheSimulatorsWithUnitCosts) {
    for (int64_t pp : {2, 3, 4})
        for (int64_t m : {1, 2, 3, 5, 8}) {
            sim::ScheduleInput in;
            in.pp = pp;
            in.micro_batches = m;
            in.schedule = sim::PipelineSchedule::zero_bubble_h1;
            in.forward_s = [](int64_t) { return 1.0; };
            in.backward_s = [](int64_t) { return 1.0; };
            in.weight_gradient_s = [](int64_t) { return 1.0; };
            const sim::ScheduleResult r = sim::run_schedule(in);
            for (int64_t s = 0; s < pp; ++s) {
                std::vector<PipelineAction> simulated;
                for (const sim::ScheduledTask& t : r.stages[static_cast<size_t>(s)]) {
                    if (t.kind == sim::TaskKind::forward)
                        simulated.push_back({Op::forward, t.micro_f});
                    else if (t.kind == sim::TaskKind::backward)
                        simulated.push_back({Op::backward_input, t.micro_b});
                    else
                        simulated.push_back({Op::backward_weight, t.micro_b});
                }
                EXPECT_EQ(pipeline_order(PipelineScheduleKind::zero_bubble_h1, pp, s, m), simulated)
                    << "pp " << pp << " m " << m << " stage " << s;
            }
        }
}

TEST(PipelineSchedule, InterleavedRunsRoundsOfPpMicroBatchesPerChunk) {
    // pp 2, vpp 2, 4 micro-batches, stage 1: warm-up (2-1-1)*2 + (2-1)*2 = 2 forwards.
    const std::vector<PipelineAction> order =
        pipeline_order(PipelineScheduleKind::interleaved, 2, 1, 4, 2);
    expect_each_action_once(order, 4, 2);
    const std::vector<PipelineAction> head(order.begin(), order.begin() + 4);
    const std::vector<PipelineAction> want = {
        {Op::forward, 0, 0}, {Op::forward, 1, 0}, {Op::forward, 0, 1}, {Op::backward, 0, 1}};
    EXPECT_EQ(head, want);
    for (int64_t s = 0; s < 2; ++s)
        expect_each_action_once(pipeline_order(PipelineScheduleKind::interleaved, 2, s, 6, 3), 6,
                                3);
    EXPECT_THROW(pipeline_order(PipelineScheduleKind::interleaved, 2, 0, 3, 2), UserError);
    // Activation sets per chunk: on pp4 with 8 micro-batches, stage 0 keeps up to 11 (chunk,
    // micro-batch) pairs in flight, chunk 0 up to 8 of them and chunk 1 up to 4 (not at once).
    const auto stage0 = pipeline_order(PipelineScheduleKind::interleaved, 4, 0, 8, 2);
    EXPECT_EQ(max_in_flight(stage0), 11);
    EXPECT_EQ(max_in_flight_per_chunk(stage0, 2), (std::vector<int64_t>{8, 4}));
    EXPECT_EQ(
        max_in_flight_per_chunk(pipeline_order(PipelineScheduleKind::interleaved, 4, 3, 8, 2), 2),
        (std::vector<int64_t>{5, 1}));
    EXPECT_EQ(
        max_in_flight_per_chunk(pipeline_order(PipelineScheduleKind::one_f_one_b, 4, 1, 8), 1),
        (std::vector<int64_t>{3}));
}

TEST(PipelineSchedule, NamesAndChunkCounts) {
    EXPECT_EQ(parse_pipeline_schedule("1f1b"), PipelineScheduleKind::one_f_one_b);
    EXPECT_EQ(parse_pipeline_schedule("interleaved"), PipelineScheduleKind::interleaved);
    EXPECT_THROW(parse_pipeline_schedule("gpipe"), UserError);
    EXPECT_EQ(schedule_for_chunks(PipelineScheduleKind::one_f_one_b, 2),
              PipelineScheduleKind::interleaved);
    EXPECT_THROW(schedule_for_chunks(PipelineScheduleKind::interleaved, 1), UserError);
    EXPECT_EQ(parse_pipeline_schedule("zb-h1"), PipelineScheduleKind::zero_bubble_h1);
    EXPECT_EQ(pipeline_schedule_name(PipelineScheduleKind::zero_bubble_h1), "zb-h1");
    EXPECT_EQ(schedule_for_chunks(PipelineScheduleKind::zero_bubble_h1, 1),
              PipelineScheduleKind::zero_bubble_h1);
    EXPECT_THROW(schedule_for_chunks(PipelineScheduleKind::zero_bubble_h1, 2), UserError);
}

}  // namespace
}  // namespace moetron
