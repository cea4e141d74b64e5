// Pipeline schedules as an event simulation: each stage runs its forward and backward tasks in
// the order Megatron-LM's 1F1B schedule runs them (interleaved over model chunks when vpp > 1),
// a task starts when its stage is free and its input has arrived from the neighbouring stage
// (plus the send/recv time), and the bubble is whatever idle time results.
//
// Order for stage s of p, v chunks, m micro-batches (Megatron-LM,
// schedules.forward_backward_pipelining_with_interleaving): N = m*v virtual micro-batches,
// warm-up = min(N, 2(p-s-1) + (v-1)p) forwards (p-s-1 without interleaving), then 1F1B pairs,
// then the remaining backwards. Virtual micro-batch k runs chunk (k/p) mod v (backward: v-1 minus
// that) of micro-batch (k/(p v)) p + k mod p. With merge_steady_state the forward and backward
// of each steady-state pair run as one task (Megatron's combined 1F1B, which hides the EP
// all-to-all of one behind the compute of the other).
//
// Zero-bubble ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward
// is split into B (input gradient, on the critical path) and W (weight gradient, which nothing
// downstream waits for). F and B run in 1F1B's order; each W waits in its stage's queue and
// runs when the stage would otherwise wait for an input, or when more than p-1 are pending, or
// at the end. B frees the activations but the W's inputs (GEMM inputs and output gradients of
// at most p-1 micro-batches, not counted by the memory model), so peak memory is about 1F1B's.
// With F = B = W the bubble is (p-1)(F+B-W) against 1F1B's (p-1)(F+B+W).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moetron::sim {

enum class TaskKind : uint8_t { forward, backward, forward_backward, weight_gradient };

// `1f1b` (Megatron-LM's 1F1B, interleaved when vpp > 1), `zb-h1` (zero bubble) and `dualpipe`
// (DeepSeek-V3's bidirectional schedule; sim/dualpipe.h).
enum class PipelineSchedule : uint8_t { one_f_one_b, zero_bubble_h1, dualpipe };
PipelineSchedule pipeline_schedule_from_name(const std::string& name);
const char* pipeline_schedule_name(PipelineSchedule s);

struct ScheduledTask {
    TaskKind kind = TaskKind::forward;
    int64_t chunk_f = -1, micro_f = -1;  // global model chunk and micro-batch of the forward
    int64_t chunk_b = -1, micro_b = -1;  // the same of the backward
    double start_s = 0, end_s = 0;
};

struct ScheduleInput {
    int64_t pp = 1, vpp = 1, micro_batches = 1;
    bool merge_steady_state = false;
    // one_f_one_b or zero_bubble_h1 (dualpipe has its own simulation).
    PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
    // Durations by global chunk g = c * pp + s (stage s, its c-th chunk). With zero_bubble_h1,
    // backward_s is B (input gradient) and weight_gradient_s is W.
    std::function<double(int64_t g)> forward_s;
    std::function<double(int64_t g)> backward_s;
    std::function<double(int64_t g)> weight_gradient_s;
    std::function<double(int64_t g_f, int64_t g_b)> forward_backward_s;
    double p2p_s = 0;  // send/recv time of one activation (or its gradient) between stages
};

struct ScheduleResult {
    std::vector<std::vector<ScheduledTask>> stages;  // per stage, in execution order
    std::vector<double> busy_s;                      // per stage: sum of task durations
    std::vector<double> end_s;                       // per stage: end of its last task
    // Per global chunk: when its last backward ends (its gradients are final).
    std::vector<double> chunk_grads_ready_s;
    double makespan_s = 0;
};

// Throws when the micro-batch count does not suit the schedule (interleaving needs a multiple
// of pp).
ScheduleResult run_schedule(const ScheduleInput& in);

// DualPipe (DeepSeek-V3 report, sec. 3.2.1 and Table 2): pp ranks (even), micro-batches fed
// from both ends; rank s holds stage s of one direction and stage pp-1-s of the other (two
// copies of the parameters). In the steady state a forward of one direction and a backward of
// the other run as one overlapped chunk (F&B) that hides the all-to-all; the split W fills the
// rest. Makespan of m micro-batches: m F&B + (pp/2 - 1)(F&B + B - 3W), where F&B is the paired
// chunk's time, B the input-gradient and W the weight-gradient part of a backward. Activations
// in flight: pp + 1 micro-batches of one stage on every rank.
double dualpipe_makespan_s(int64_t pp, int64_t micro_batches, double forward_backward_s,
                           double backward_input_s, double weight_gradient_s);

// The task order of one stage without timing (used by the memory model too).
std::vector<ScheduledTask> stage_order(int64_t stage, int64_t pp, int64_t vpp,
                                       int64_t micro_batches, bool merge_steady_state);

}  // namespace moetron::sim
