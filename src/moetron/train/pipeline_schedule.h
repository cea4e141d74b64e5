// Pipeline schedules: the order in which one pipeline stage runs the forwards and backwards of a
// step's micro-batches. Pure functions of (pp, stage, micro-batches), the same on every rank, so
// each stage knows what its neighbours do and the point-to-point transfers match up.
//
//   1f1b (PipeDream-flush, Megatron-LM's non-interleaved schedule): stage s runs
//     min(pp - s - 1, m) warm-up forwards, then alternates one forward and one backward, then
//     drains the remaining backwards. At most pp - s micro-batches are in flight on stage s (their
//     activations kept), instead of all m as with GPipe; the bubble is (pp - 1) / (m + pp - 1) of
//     the step, as with GPipe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace moetron {

enum class PipelineScheduleKind : uint8_t { one_f_one_b };

// "1f1b"; throws moetron::UserError for anything else, listing the choices.
PipelineScheduleKind parse_pipeline_schedule(std::string_view name);
std::string_view pipeline_schedule_name(PipelineScheduleKind kind);

struct PipelineAction {
    enum class Op : uint8_t { forward, backward } op;
    int64_t micro_batch;
    bool operator==(const PipelineAction&) const = default;
};

// The order stage `stage` (in [0, pp)) runs the forward and the backward of each of
// `micro_batches` micro-batches in. Every micro-batch appears once as a forward, then once as a
// backward; forwards and backwards each in micro-batch order.
std::vector<PipelineAction> pipeline_order(PipelineScheduleKind kind, int64_t pp, int64_t stage,
                                           int64_t micro_batches);

// The most micro-batches of `order` whose forward has run and backward not yet: the activation
// sets the stage needs (Model's pipeline_in_flight).
int64_t max_in_flight(const std::vector<PipelineAction>& order);

}  // namespace moetron
