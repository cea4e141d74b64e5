// Pipeline schedules: the order in which one pipeline stage runs the forwards and backwards of a
// step's micro-batches. Pure functions of (pp, stage, micro-batches), the same on every rank, so
// each stage knows what its neighbours do and the point-to-point transfers match up.
//
//   1f1b (PipeDream-flush, Megatron-LM's non-interleaved schedule): stage s runs
//     min(pp - s - 1, m) warm-up forwards, then alternates one forward and one backward, then
//     drains the remaining backwards. At most pp - s micro-batches are in flight on stage s (their
//     activations kept), instead of all m as with GPipe; the bubble is (pp - 1) / (m + pp - 1) of
//     the step, as with GPipe.
//   interleaved (Megatron-LM's interleaved 1F1B, vpp > 1): each stage holds vpp model chunks
//     (chunk c of stage s is virtual stage c * pp + s); the forwards go in rounds of pp
//     micro-batches through chunk 0, then the same pp through chunk 1, ..., the backwards
//     likewise from the last chunk; (pp - s - 1) * 2 + (vpp - 1) * pp warm-up forwards, then one
//     forward and one backward alternate. The bubble shrinks by vpp for vpp times the transfers.
//     As in Megatron-LM, m must be a multiple of pp.
//   zb-h1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): each backward is split in
//     two, B (the input gradient, which the previous stage waits for) and W (the weight
//     gradient, which nobody waits for). F and B run in 1F1B's order; each W joins a queue and
//     runs, oldest first, where the stage would otherwise wait for its next input, or when more
//     than pp - 1 are queued, or at the end: the W's of late micro-batches fill the cool-down
//     bubble. Where "would wait" is decided with unit costs (F = B = W, free transfers) on a
//     model of all stages, so every rank derives the same order; sim/schedule.h simulates the
//     same rule with measured costs. The activations in flight are 1F1B's (B frees them); the
//     queued W's keep their GEMM inputs and output gradients (PipelineRunner's stash), at most
//     max_weight_gradients_pending of them. Bubble with F = B = W: (pp - 1)(F + B - W) against
//     1F1B's (pp - 1)(F + B + W).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace moetron {

enum class PipelineScheduleKind : uint8_t { one_f_one_b, interleaved, zero_bubble_h1 };

// "1f1b", "interleaved" or "zb-h1"; throws moetron::UserError for anything else, listing the
// choices.
PipelineScheduleKind parse_pipeline_schedule(std::string_view name);
// The schedule a run of vpp chunks per stage uses: 1f1b with vpp > 1 is the interleaved one (as
// in Megatron-LM and moetron simulate); interleaved with vpp = 1 and zb-h1 with vpp > 1 are
// UserErrors.
PipelineScheduleKind schedule_for_chunks(PipelineScheduleKind kind, int64_t vpp);
std::string_view pipeline_schedule_name(PipelineScheduleKind kind);

struct PipelineAction {
    // backward: the whole backward; backward_input and backward_weight: its two halves (B and W)
    // in the zero-bubble schedule, each micro-batch's W after its B.
    enum class Op : uint8_t { forward, backward, backward_input, backward_weight } op;
    int64_t micro_batch;
    int64_t chunk = 0;  // the stage's model chunk, in [0, vpp)
    bool operator==(const PipelineAction&) const = default;
};

// The order stage `stage` (in [0, pp)) runs the forward and the backward of each of
// `micro_batches` micro-batches in, through each of its vpp chunks. Every (chunk, micro-batch)
// appears once as a forward, then once as a backward (or a backward_input, then a
// backward_weight); per chunk, forwards and backwards each in micro-batch order. Throws
// moetron::UserError for interleaved with micro_batches not a multiple of pp.
std::vector<PipelineAction> pipeline_order(PipelineScheduleKind kind, int64_t pp, int64_t stage,
                                           int64_t micro_batches, int64_t vpp = 1);

// The most micro-batches of `order` whose forward has run and backward (or backward_input) not
// yet.
int64_t max_in_flight(const std::vector<PipelineAction>& order);
// The same for each of the stage's vpp chunks on its own: the activation sets each chunk needs
// (Model's pipeline_in_flight). Their sum can exceed max_in_flight: the chunks peak at
// different times.
std::vector<int64_t> max_in_flight_per_chunk(const std::vector<PipelineAction>& order, int64_t vpp);
// The most weight gradients of `order` queued at once: backward_inputs begun whose
// backward_weight has not run, the running one included (0 without split backwards).
int64_t max_weight_gradients_pending(const std::vector<PipelineAction>& order);

}  // namespace moetron
