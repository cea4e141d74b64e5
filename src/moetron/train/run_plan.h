// One resolved plan of a training run. RunSettings is what the user asked for, in the command
// line's terms (train's flags; bench_train_step's and info's options map onto the same struct);
// plan_run resolves it once against the model, the [train] settings and the world size: the
// topology, the pipeline's schedule and chunks, the MoE settings, the precision and the sizes of
// the buffers. The Trainer runs the plan, and `train`, bench_train_step and `info` print it with
// the same lines (describe_run_plan); nothing parses a setting a second time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/checkpoint/train_config.h"
#include "moetron/core/precision.h"
#include "moetron/model/config.h"
#include "moetron/model/model.h"
#include "moetron/model/pipeline_layout.h"
#include "moetron/parallel/dispatch_traffic.h"
#include "moetron/parallel/topology.h"
#include "moetron/train/pipeline_schedule.h"

namespace moetron {

// What a run asks for (train's --layout, --domain-size, --pp-schedule, --pp-layout,
// --precision, --dispatch-payload, the MoE flags, --bucket-mb, --no-zero1,
// --no-overlap-dp-grad). The defaults are one process's float32 run.
struct RunSettings {
    std::string layout;      // as parse_layout: "dp4", "ep2", "pp2.ep2", ...; empty: world of one
    int domain_size = 0;     // ranks per scale-up domain (0: one domain)
    double bucket_mb = 4.0;  // gradient-sync bucket size in MiB (1 MiB = 2^20 bytes)
    bool zero1 = true;       // shard the optimizer state where a group has more than one rank
    bool overlap_dp_grad = true;  // post gradient buckets during the backward
    // How the MoE layers run (model.h). Its token_format is resolved from dispatch_payload: the
    // recipe's format by default, the activations' float32 with DispatchPayload::activation.
    MoeSettings moe;
    parallel::DispatchPayload dispatch_payload = parallel::DispatchPayload::recipe;
    // Pipeline parallelism (pp > 1 in layout): which blocks each chunk runs, Megatron-LM's
    // layout string (empty: default_pipeline_layout), and the schedule's name.
    std::string pp_layout;
    std::string pp_schedule = "1f1b";
    // The recipe: the number format of each GEMM by its role (model/compute.h).
    Precision precision = Precision::fp32;
};

struct RunPlan {
    RunSettings settings;  // as asked
    parallel::Topology topology;
    // The schedule the stages run (interleaved whenever vpp > 1); meaningful with pp > 1.
    PipelineScheduleKind schedule = PipelineScheduleKind::one_f_one_b;
    // The pipeline layout in effect (the given one, or the default) and its pp * vpp chunks in
    // model order; empty without pipeline parallelism.
    std::string pp_layout;
    std::vector<PipelineChunk> chunks;
    // The MoE settings with the dispatch's token format resolved, and the recipe.
    MoeSettings moe;
    Precision precision = Precision::fp32;
    int64_t rank_rows = 0;     // sequences of a micro-batch that one rank runs (batch_size / dp)
    int64_t grad_accum = 1;    // micro-batches per optimizer step
    int64_t bucket_bytes = 0;  // gradient-sync bucket size
    // ZeRO-1 where it shards anything (a DP or EDP group of more than one rank).
    bool zero1 = false;
    bool overlap_dp_grad = true;
    // zb-h1: the model's backwards are split into B and W (kernels/split_backward_backend.h).
    bool split_backward = false;

    bool pipelined() const { return topology.pp > 1; }
    // Stage `stage`'s chunks (stage, stage + pp, ...), and for each the micro-batches whose
    // activations it keeps at once under the schedule.
    std::vector<PipelineChunk> stage_chunks(int stage) const;
    std::vector<int64_t> stage_in_flight(int stage) const;
};

// The topology of settings.layout on world_size ranks (a user error for one that does not fit).
parallel::Topology plan_topology(const RunSettings& settings, int world_size);

// Resolves settings for a run of `model` with the [train] settings `config` on world_size ranks;
// throws (a user error) for a layout that does not fit the world, the model or the batch, an
// unknown schedule or a pipeline layout that does not cover the model.
RunPlan plan_run(const ModelConfig& model, const TrainConfig& config, const RunSettings& settings,
                 int world_size);

// The memory one rank of the plan holds, as the engine's planners size it.
RankMemoryPlan plan_run_memory(const ModelConfig& model, const TrainConfig& config,
                               const RunPlan& plan);

// The run header's lines about the plan ("ranks ...", its pipeline and its experts), for every
// command that prints a plan. Empty for a world of one without experts to place.
std::vector<std::string> describe_run_plan(const RunPlan& plan, const TrainConfig& config);

}  // namespace moetron
