// One training step on the cluster: per-chunk op timelines (with the host racing the GPU and
// the overlap rules), the pipeline schedule, gradient sync and optimizer, memory per GPU, and
// the delivered throughput. simulate_step() is what `moetron simulate` prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/model/moe.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/layout.h"
#include "moetron/sim/memory.h"
#include "moetron/sim/ops.h"
#include "moetron/sim/schedule.h"
#include "moetron/sim/timeline.h"

namespace moetron::sim {

struct SimOptions {
    Precision precision = Precision::bf16;  // the recipe (--precision)
    int64_t seq_len = 4096;
    int64_t global_batch = 0;  // sequences per step
    int64_t micro_batch = 1;   // sequences per micro-batch
    bool count_mtp = true;     // count the MTP FLOPs and simulate the MTP layer
    Recompute recompute;
    parallel::DispatchKind dispatcher = parallel::DispatchKind::two_tier;
    // What the dispatched tokens travel as (--dispatch-payload): by default as the activations
    // are (bf16), as Megatron-LM sends them; recipe: in the GEMM format (DeepSeek-V3's FP8).
    parallel::DispatchPayload dispatch_payload = parallel::DispatchPayload::activation;
    CudaGraphs cuda_graphs = CudaGraphs::none;
    // Overlap rules, each switchable.
    // How the MoE all-to-all hides (--moe-overlap, the engine's word): dual is priced as
    // Megatron-LM's combined 1F1B, the forward of one micro-batch and the backward of another
    // run as one task, each one's EP all-to-all behind the other's compute (combined_1f1b());
    // shared (the shared experts alone behind the dispatch) is not modelled and is refused.
    MoeOverlap moe_overlap = MoeOverlap::off;
    bool overlap_tp = false;       // TP all-gather / reduce-scatter behind the adjacent GEMM
    bool overlap_dp_grad = true;   // gradient reduce-scatter behind the backward pass
    bool overlap_dp_param = true;  // parameter all-gather behind the next forward
    PipelineSchedule pipeline_schedule = PipelineSchedule::one_f_one_b;
    // Megatron-LM pipeline layout ("Et|(tt|)*30mL"); empty: balanced by simulated time.
    std::string pipeline_layout;
    MemoryOptions memory;
    // Routing imbalance: the load of every routed expert (sim/expert_imbalance.h; empty:
    // balanced routing) and the redundant expert slots over each EP group (training's
    // --redundant-experts R: (E + R) / ep slots per rank, the spare ones replicating hot experts).
    std::vector<double> expert_loads;
    int64_t redundant_experts = 0;

    bool combined_1f1b() const { return moe_overlap == MoeOverlap::dual; }
};

// Throws a user error for a --moe-overlap the cluster model does not price (shared).
void check_moe_overlap_modelled(MoeOverlap overlap);

struct StepResult {
    std::string model_name, cluster_name;
    parallel::Layout layout;
    LayoutPlacement placement;  // where its groups sit on the cluster's domains
    SimOptions options;
    int64_t gpus = 0;
    int64_t micro_batches = 0;  // per pipeline, per step
    // Tokens per EP rank, max / mean, from the expert loads: the contiguous split without
    // redundant experts, the redundant placement with them (1 for balanced routing).
    double expert_imbalance = 1;

    double step_time_s = 0;
    double tokens_per_s_per_gpu = 0;
    double model_flops_per_token = 0;  // model/flops convention, MTP per count_mtp
    double tflops_per_gpu = 0;         // delivered (model FLOPs / step time / GPUs)
    double mfu = 0;                    // over the dense peak of the training precision
    TimeBreakdown breakdown;           // the critical pipeline stage
    int64_t critical_stage = 0;

    MemoryBreakdown memory;  // the fullest stage
    std::vector<MemoryBreakdown> memory_per_stage;

    std::vector<std::vector<int>> stage_layers;  // main-model layers per global chunk
    // Per global chunk, its blocks' forward and backward times in order (layer boundaries).
    std::vector<std::vector<std::pair<double, double>>> chunk_block_times;
    ScheduleResult schedule;
    std::vector<OpEvent> moe_layer_forward, moe_layer_backward;  // one layer, for the SVG
    double dp_end_s = 0, optimizer_end_s = 0;                    // step-end phases, for the SVG
};

// Throws on impossible inputs (layout, precision, batch) and on out-of-memory, saying by how
// much the fullest GPU is over its HBM and naming the cheapest change that fits (sim/fit.h).
StepResult simulate_step(const ModelConfig& model, const ClusterSpec& cluster,
                         const parallel::Layout& layout, const SimOptions& options);

// The same without the out-of-memory rejection (for reporting what would not fit).
StepResult simulate_step_unchecked(const ModelConfig& model, const ClusterSpec& cluster,
                                   const parallel::Layout& layout, const SimOptions& options);

}  // namespace moetron::sim
