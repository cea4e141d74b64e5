#include "moetron/train/pipeline_schedule.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

PipelineScheduleKind parse_pipeline_schedule(std::string_view name) {
    if (name == "1f1b") return PipelineScheduleKind::one_f_one_b;
    if (name == "interleaved") return PipelineScheduleKind::interleaved;
    MT_USER_THROW("[pp-schedule] unknown pipeline schedule '{}' (known: 1f1b, interleaved)", name);
}

PipelineScheduleKind schedule_for_chunks(PipelineScheduleKind kind, int64_t vpp) {
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
    }
    MT_THROW("[pipeline] unknown schedule kind {}", static_cast<int>(kind));
}

std::vector<int64_t> max_in_flight_per_chunk(const std::vector<PipelineAction>& order,
                                             int64_t vpp) {
    std::vector<int64_t> now(static_cast<size_t>(vpp), 0), most(static_cast<size_t>(vpp), 0);
    for (const PipelineAction& a : order) {
        const auto c = static_cast<size_t>(a.chunk);
        now[c] += a.op == PipelineAction::Op::forward ? 1 : -1;
        most[c] = std::max(most[c], now[c]);
    }
    return most;
}

int64_t max_in_flight(const std::vector<PipelineAction>& order) {
    int64_t now = 0, most = 0;
    for (const PipelineAction& a : order) {
        now += a.op == PipelineAction::Op::forward ? 1 : -1;
        most = std::max(most, now);
    }
    return most;
}

}  // namespace moetron
