#include "moetron/train/pipeline_schedule.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

PipelineScheduleKind parse_pipeline_schedule(std::string_view name) {
    if (name == "1f1b") return PipelineScheduleKind::one_f_one_b;
    MT_USER_THROW("[pp-schedule] unknown pipeline schedule '{}' (known: 1f1b)", name);
}

std::string_view pipeline_schedule_name(PipelineScheduleKind kind) {
    switch (kind) {
        case PipelineScheduleKind::one_f_one_b:
            return "1f1b";
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

}  // namespace

std::vector<PipelineAction> pipeline_order(PipelineScheduleKind kind, int64_t pp, int64_t stage,
                                           int64_t micro_batches) {
    MT_CHECK(pp >= 1 && stage >= 0 && stage < pp && micro_batches >= 1,
             "[pipeline] bad schedule shape: pp {}, stage {}, {} micro-batches", pp, stage,
             micro_batches);
    switch (kind) {
        case PipelineScheduleKind::one_f_one_b:
            return one_f_one_b(pp, stage, micro_batches);
    }
    MT_THROW("[pipeline] unknown schedule kind {}", static_cast<int>(kind));
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
