// The phases of one simulated training step, which simulate_step_unchecked (step.cpp) runs in
// order: what each block and each pipeline chunk costs, and the pipeline schedule over the
// chunks (step_chunks.cpp); then, per pipeline stage, the data-parallel gradient sync, the
// optimizer, the parameter gather and the memory, and the step's time (step_stages.cpp).
// Internal to sim/.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/sim/chunks.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/memory.h"
#include "moetron/sim/ops.h"
#include "moetron/sim/schedule.h"
#include "moetron/sim/step.h"
#include "moetron/sim/timeline.h"

namespace moetron::sim::step_phases {

// The pipeline's shape and the schedule options that the phases after the block costs read.
struct PipelineShape {
    int64_t pp = 1, vpp = 1;
    int64_t chunks = 1;  // pp * vpp
    int64_t micro_batches = 1;
    bool zero_bubble = false;  // ZB-H1: backwards split into B and W
    bool dualpipe = false;
    // The schedule the event simulation runs: DualPipe's order is stood in for by the
    // combined 1F1B (F&B pairs), its makespan computed apart (schedule.h).
    PipelineSchedule simulated = PipelineSchedule::one_f_one_b;
    bool merge_steady_state = false;  // combined forward-backward tasks (EP overlap, DualPipe)
    double p2p_s = 0;                 // one activation (or its gradient) between stages
    double comm_sm_fraction = 0;      // compute slowed by a collective running beside it
    // The chunks a stage holds: its vpp chunks, and with DualPipe the mirrored stage too.
    std::vector<int64_t> chunks_of_stage(int64_t stage) const;
};

PipelineShape pipeline_shape(const OpContext& ctx, const SimOptions& o, int64_t micro_batches);

// One micro-batch through a block or a chunk: with the EP all-to-all inline and deferred (for
// the combined forward-backward tasks), and the backward split into B and W (zero bubble).
struct Walks {
    WalkResult fwd, bwd, fwd_deferred, bwd_deferred;
    WalkResult bwd_input, bwd_weight;
};

// A combined task, the forward of one chunk beside the backward of another: each one's EP
// all-to-all hides behind the other's compute, which the collectives slow by comm_sm_fraction.
double forward_backward_s(const Walks& forward, const Walks& backward, double comm_sm_fraction);

// Each kind of block the model has: its ops, its backward with recompute, its walks and its
// stand-alone cost (what the chunk layout balances).
struct BlockCosts {
    std::map<BlockKind, BlockOps> ops;
    std::map<BlockKind, RecomputedBlock> recomputed;
    std::map<BlockKind, Walks> walks;
    std::map<BlockKind, double> cost_s;
};
BlockCosts block_costs(const OpContext& ctx, const SimOptions& o, bool with_mtp);

using ChunkGroups = std::vector<std::vector<ChunkBlock>>;

// The blocks of each chunk: the --pp-layout given, or of two balanced splits the one whose
// schedule ends first.
ChunkGroups chunk_layout(const ModelConfig& model, const SimOptions& o, bool with_mtp,
                         const BlockCosts& blocks, const PipelineShape& shape);

// What a chunk keeps on its GPU for one micro-batch, and its parameters.
struct ChunkFootprint {
    double saved_bytes = 0;
    double offloaded_bytes = 0;
    double largest_offloaded_block_bytes = 0;
    double weight_gradient_input_bytes = 0;  // held by a deferred W pass
    BlockParams params;
};

struct ChunkCosts {
    std::vector<Walks> walks;  // by global chunk
    std::vector<ChunkFootprint> footprint;
};
ChunkCosts chunk_costs(const OpContext& ctx, const SimOptions& o, const BlockCosts& blocks,
                       const ChunkGroups& groups);

// The pipeline schedule of the chunks; with DualPipe, the stand-in's timeline stretched to
// DualPipe's makespan.
ScheduleResult pipeline_schedule(const std::vector<Walks>& chunks, const PipelineShape& shape);

// One stage's step end: its gradient sync, the compute the sync slowed, its optimizer and the
// next step's parameter gather that its forward waits for.
struct StageSync {
    double grads_synced_s = 0;  // gradients reduced (not before the stage's compute ends)
    double interference_s = 0;  // the compute slowed by the sync running beside it
    double optimizer_s = 0;
    double param_gather_exposed_s = 0;
};
std::vector<StageSync> data_parallel_sync(const OpContext& ctx, const SimOptions& o,
                                          const PipelineShape& shape,
                                          const ScheduleResult& schedule, const ChunkCosts& chunks,
                                          const ChunkGroups& groups);

// The step's time: every GPU waits for the slowest stage's sync, optimizer and gather, and the
// slowest GPU's speed.
struct StepTime {
    double compute_end_s = 0;  // the last stage's gradient sync (and its interference) done
    double optimizer_s = 0;    // the slowest stage's
    double param_gather_s = 0;
    double synchronized_s = 0;  // the three summed, before the slowest GPU's delay
    SlowestOfN slowest;
    double step_s() const { return synchronized_s * (1 + slowest.total()); }
};
StepTime step_time(const ClusterSpec& cluster, const parallel::Layout& layout,
                   const std::vector<StageSync>& stages);

// Where the critical stage's step time goes: its tasks, then what the step adds around them.
TimeBreakdown critical_stage_breakdown(const StepResult& r, const PipelineShape& shape,
                                       const ChunkCosts& chunks, const StageSync& critical,
                                       const StepTime& time);

// Per stage: the static parts plus the peak of the activations in flight and the communication
// buffers.
std::vector<MemoryBreakdown> stage_memory(const ModelConfig& model, const ClusterSpec& cluster,
                                          const parallel::Layout& layout, const SimOptions& o,
                                          const PipelineShape& shape,
                                          const ScheduleResult& schedule, const ChunkCosts& chunks,
                                          const ChunkGroups& groups);

}  // namespace moetron::sim::step_phases
