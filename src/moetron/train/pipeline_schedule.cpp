#include "moetron/train/pipeline_schedule.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

PipelineScheduleKind parse_pipeline_schedule(std::string_view name) {
    if (name == "1f1b") return PipelineScheduleKind::one_f_one_b;
    if (name == "interleaved") return PipelineScheduleKind::interleaved;
    if (name == "zb-h1") return PipelineScheduleKind::zero_bubble_h1;
    MT_USER_THROW("[pp-schedule] unknown pipeline schedule '{}' (known: 1f1b, interleaved, zb-h1)",
                  name);
}

PipelineScheduleKind schedule_for_chunks(PipelineScheduleKind kind, int64_t vpp) {
    MT_USER_CHECK(kind != PipelineScheduleKind::zero_bubble_h1 || vpp == 1,
                  "[pp-schedule] the zero-bubble schedule zb-h1 runs one model chunk per stage: "
                  "drop vpp from the layout, or use the interleaved schedule");
    if (vpp > 1) return PipelineScheduleKind::interleaved;
    MT_USER_CHECK(kind != PipelineScheduleKind::interleaved,
                  "[pp-schedule] the interleaved schedule needs several model chunks per stage: "
                  "add vpp to the layout (e.g. pp2.vpp2)");
    return kind;
}

std::string_view pipeline_schedule_name(PipelineScheduleKind kind) {
    switch (kind) {
        case PipelineScheduleKind::one_f_one_b:
            return "1f1b";
        case PipelineScheduleKind::interleaved:
            return "interleaved";
        case PipelineScheduleKind::zero_bubble_h1:
            return "zb-h1";
    }
    return "unknown";
}

namespace {

std::vector<PipelineAction> one_f_one_b(int64_t pp, int64_t stage, int64_t m) {
    using Op = PipelineAction::Op;
    std::vector<PipelineAction> order;
    order.reserve(static_cast<size_t>(2 * m));
    const int64_t warmup = std::min(pp - stage - 1, m);
    int64_t forwards = 0, backwards = 0;
    for (; forwards < warmup; ++forwards) order.push_back({Op::forward, forwards});
    while (forwards < m) {
        order.push_back({Op::forward, forwards++});
        order.push_back({Op::backward, backwards++});
    }
    while (backwards < m) order.push_back({Op::backward, backwards++});
    return order;
}

// Megatron-LM's interleaved schedule (schedules.py, forward_backward_pipelining_with_
// interleaving): the k-th forward of the stage is micro-batch (k / (pp vpp)) pp + k % pp of
// chunk (k / pp) % vpp; the k-th backward the same micro-batch of chunk vpp - 1 - (k / pp) % vpp.
std::vector<PipelineAction> interleaved(int64_t pp, int64_t stage, int64_t m, int64_t vpp) {
    using Op = PipelineAction::Op;
    MT_USER_CHECK(m % pp == 0,
                  "[pp-schedule] the interleaved schedule runs the micro-batches in rounds of pp: "
                  "{} micro-batches (--grad-accum) are not a multiple of pp {}",
                  m, pp);
    const int64_t total = m * vpp;
    const int64_t warmup = std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, total);
    auto micro_of = [&](int64_t k) { return (k / (pp * vpp)) * pp + k % pp; };
    auto forward = [&](int64_t k) {
        return PipelineAction{Op::forward, micro_of(k), (k / pp) % vpp};
    };
    auto backward = [&](int64_t k) {
        return PipelineAction{Op::backward, micro_of(k), vpp - 1 - (k / pp) % vpp};
    };
    std::vector<PipelineAction> order;
    order.reserve(static_cast<size_t>(2 * total));
    for (int64_t k = 0; k < warmup; ++k) order.push_back(forward(k));
    for (int64_t k = 0; k < total - warmup; ++k) {
        order.push_back(forward(warmup + k));
        order.push_back(backward(k));
    }
    for (int64_t k = total - warmup; k < total; ++k) order.push_back(backward(k));
    return order;
}

// ZB-H1: every stage's F and B in 1F1B's order, run on a model of the whole pipeline in unit
// time steps (F = B = W = 1, transfers free) to place the W's: before each F or B, the stage runs
// queued W's (oldest first) while its input is not there yet or more than pp - 1 are queued;
// the rest after its last B. The same rule as sim/schedule.cpp's run_schedule.
std::vector<PipelineAction> zero_bubble_h1(int64_t pp, int64_t stage, int64_t m) {
    using Op = PipelineAction::Op;
    constexpr int64_t kNotYet = -1;
    std::vector<std::vector<PipelineAction>> critical(static_cast<size_t>(pp));
    for (int64_t s = 0; s < pp; ++s) {
        critical[static_cast<size_t>(s)] = one_f_one_b(pp, s, m);
        for (PipelineAction& a : critical[static_cast<size_t>(s)])
            if (a.op == Op::backward) a.op = Op::backward_input;
    }
    // When each stage's F and B of each micro-batch ended (kNotYet: not run).
    std::vector<int64_t> forward_end(static_cast<size_t>(pp * m), kNotYet);
    std::vector<int64_t> backward_end(static_cast<size_t>(pp * m), kNotYet);
    auto at = [m](int64_t s, int64_t i) { return static_cast<size_t>(s * m + i); };
    std::vector<std::vector<PipelineAction>> orders(static_cast<size_t>(pp));
    std::vector<size_t> next(static_cast<size_t>(pp), 0);
    std::vector<int64_t> free_at(static_cast<size_t>(pp), 0);
    std::vector<int64_t> weights_queued(static_cast<size_t>(pp), 0);
    std::vector<int64_t> weights_done(static_cast<size_t>(pp), 0);
    auto run_weight = [&](size_t s) {
        orders[s].push_back({Op::backward_weight, weights_done[s]++});
        --weights_queued[s];
        ++free_at[s];
    };
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int64_t s = 0; s < pp; ++s) {
            const auto si = static_cast<size_t>(s);
            while (next[si] < critical[si].size()) {
                const PipelineAction a = critical[si][next[si]];
                const int64_t ready = a.op == Op::forward
                                          ? (s == 0 ? 0 : forward_end[at(s - 1, a.micro_batch)])
                                          : (s == pp - 1 ? forward_end[at(s, a.micro_batch)]
                                                         : backward_end[at(s + 1, a.micro_batch)]);
                if (ready == kNotYet) break;
                while (weights_queued[si] > 0 &&
                       (free_at[si] < ready || weights_queued[si] > pp - 1))
                    run_weight(si);
                free_at[si] = std::max(free_at[si], ready) + 1;
                (a.op == Op::forward ? forward_end : backward_end)[at(s, a.micro_batch)] =
                    free_at[si];
                orders[si].push_back(a);
                if (a.op == Op::backward_input) ++weights_queued[si];
                ++next[si];
                progressed = true;
            }
        }
    }
    const auto mine = static_cast<size_t>(stage);
    MT_CHECK(next[mine] == critical[mine].size(),
             "[pipeline] internal error: the zb-h1 order deadlocked (pp {}, {} micro-batches)", pp,
             m);
    while (weights_queued[mine] > 0) run_weight(mine);
    return orders[mine];
}

}  // namespace

std::vector<PipelineAction> pipeline_order(PipelineScheduleKind kind, int64_t pp, int64_t stage,
                                           int64_t micro_batches, int64_t vpp) {
    MT_CHECK(pp >= 1 && stage >= 0 && stage < pp && micro_batches >= 1 && vpp >= 1,
             "[pipeline] bad schedule shape: pp {}, stage {}, {} micro-batches, vpp {}", pp, stage,
             micro_batches, vpp);
    switch (kind) {
        case PipelineScheduleKind::one_f_one_b:
            MT_CHECK(vpp == 1, "[pipeline] 1f1b runs one chunk per stage, not {}", vpp);
            return one_f_one_b(pp, stage, micro_batches);
        case PipelineScheduleKind::interleaved:
            return interleaved(pp, stage, micro_batches, vpp);
        case PipelineScheduleKind::zero_bubble_h1:
            MT_CHECK(vpp == 1, "[pipeline] zb-h1 runs one chunk per stage, not {}", vpp);
            return zero_bubble_h1(pp, stage, micro_batches);
    }
    MT_THROW("[pipeline] unknown schedule kind {}", static_cast<int>(kind));
}

namespace {

// How an action changes the micro-batches whose activations a stage keeps: a forward takes a set,
// a backward or backward_input frees it (W only needs what the runner stashed).
int64_t in_flight_change(const PipelineAction& a) {
    switch (a.op) {
        case PipelineAction::Op::forward:
            return 1;
        case PipelineAction::Op::backward:
        case PipelineAction::Op::backward_input:
            return -1;
        case PipelineAction::Op::backward_weight:
            return 0;
    }
    return 0;
}

}  // namespace

std::vector<int64_t> max_in_flight_per_chunk(const std::vector<PipelineAction>& order,
                                             int64_t vpp) {
    std::vector<int64_t> now(static_cast<size_t>(vpp), 0), most(static_cast<size_t>(vpp), 0);
    for (const PipelineAction& a : order) {
        const auto c = static_cast<size_t>(a.chunk);
        now[c] += in_flight_change(a);
        most[c] = std::max(most[c], now[c]);
    }
    return most;
}

int64_t max_in_flight(const std::vector<PipelineAction>& order) {
    int64_t now = 0, most = 0;
    for (const PipelineAction& a : order) {
        now += in_flight_change(a);
        most = std::max(most, now);
    }
    return most;
}

int64_t max_weight_gradients_pending(const std::vector<PipelineAction>& order) {
    int64_t now = 0, most = 0;
    for (const PipelineAction& a : order) {
        if (a.op == PipelineAction::Op::backward_input) most = std::max(most, ++now);
        if (a.op == PipelineAction::Op::backward_weight) --now;
    }
    return most;
}

}  // namespace moetron
