#include "moetron/train/run_plan.h"

#include <fmt/format.h>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/model/layout_fit.h"
#include "moetron/parallel/layout.h"
#include "moetron/train/pipeline_runner.h"

namespace moetron {

namespace {

constexpr double kBytesPerMiB = 1024.0 * 1024.0;

}  // namespace

std::vector<PipelineChunk> RunPlan::stage_chunks(int stage) const {
    std::vector<PipelineChunk> mine;
    for (int64_t c = 0; c < topology.vpp; ++c)
        mine.push_back(chunks[static_cast<size_t>(c * topology.pp + stage)]);
    return mine;
}

std::vector<int64_t> RunPlan::stage_in_flight(int stage) const {
    return PipelineRunner::sets_needed(schedule, topology.pp, stage, grad_accum, topology.vpp);
}

parallel::Topology plan_topology(const RunSettings& settings, int world_size) {
    return parallel::make_topology(parallel::parse_layout(settings.layout), world_size,
                                   settings.domain_size);
}

RunPlan plan_run(const ModelConfig& model, const TrainConfig& config, const RunSettings& settings,
                 int world_size) {
    validate_train_config(config);
    MT_USER_CHECK(config.seq_len <= model.max_position_embeddings,
                  "seq_len {} is longer than the model's max_position_embeddings {}",
                  config.seq_len, model.max_position_embeddings);
    MT_USER_CHECK(settings.bucket_mb > 0, "--bucket-mb must be positive, got {}",
                  settings.bucket_mb);
    RunPlan plan;
    plan.settings = settings;
    plan.topology = plan_topology(settings, world_size);
    const parallel::Topology& t = plan.topology;
    validate_topology_for_model(t, model);
    MT_USER_CHECK(config.batch_size % t.dp == 0,
                  "batch_size {} sequences do not split over the {} data-parallel ranks of "
                  "layout '{}'; use a multiple of {}",
                  config.batch_size, t.dp, settings.layout, t.dp);
    // A mistaken --pp-schedule or --pp-layout is refused on any layout, not only a pipelined one.
    plan.schedule = schedule_for_chunks(parse_pipeline_schedule(settings.pp_schedule), t.vpp);
    const int64_t num_chunks = static_cast<int64_t>(t.pp) * t.vpp;
    const int64_t mtp_modules = model.num_nextn_predict_layers;
    if (t.pp > 1 || !settings.pp_layout.empty()) {
        const std::string pp_layout = settings.pp_layout.empty()
                                          ? default_pipeline_layout(model, num_chunks, mtp_modules)
                                          : settings.pp_layout;
        std::vector<PipelineChunk> chunks =
            pipeline_chunks(model, pp_layout, num_chunks, mtp_modules);
        if (t.pp > 1) {
            plan.pp_layout = pp_layout;
            plan.chunks = std::move(chunks);
        }
    }
    plan.split_backward = t.pp > 1 && plan.schedule == PipelineScheduleKind::zero_bubble_h1;

    MT_USER_CHECK(settings.moe.rebalance_every == 0 || (model.n_routed_experts > 0 && t.ep > 1),
                  "--rebalance-every needs expert parallelism (a layout with ep > 1) and "
                  "--redundant-experts");
    require_engine_recipe(settings.precision);  // nvfp4: only the cluster model prices it
    plan.moe = settings.moe;
    plan.moe.token_format =
        parallel::engine_token_format(settings.dispatch_payload, settings.precision);
    plan.precision = settings.precision;
    plan.rank_rows = config.batch_size / t.dp;
    plan.grad_accum = config.grad_accum;
    plan.bucket_bytes = static_cast<int64_t>(settings.bucket_mb * kBytesPerMiB);
    // ZeRO-1 shards over the DP and EDP groups; when both are one rank (one process, or a job of
    // tensor parallelism only) it would only add copies of the whole state.
    plan.zero1 = settings.zero1 && (t.dp > 1 || t.edp > 1);
    plan.overlap_dp_grad = settings.overlap_dp_grad;
    return plan;
}

RankMemoryPlan plan_run_memory(const ModelConfig& model, const TrainConfig& config,
                               const RunPlan& plan) {
    ModelRuntime runtime;
    runtime.batch_size = plan.rank_rows;
    runtime.seq_len = config.seq_len;
    runtime.precision = plan.precision;
    return plan_rank_memory(model, runtime, plan.topology, plan.moe, plan.zero1);
}

std::vector<std::string> describe_run_plan(const RunPlan& plan, const TrainConfig& config) {
    std::vector<std::string> lines;
    const parallel::Topology& t = plan.topology;
    if (t.world_size == 1) return lines;
    lines.push_back(fmt::format(
        "ranks   {}; {}, {:.1f} MiB gradient buckets{}", t.str(),
        plan.zero1 ? "ZeRO-1 optimizer" : "replicated optimizer", plan.settings.bucket_mb,
        plan.overlap_dp_grad ? " posted during the backward" : " posted after it"));
    lines.push_back(fmt::format("        per rank: {} of the {} sequences of each micro-batch",
                                plan.rank_rows, config.batch_size));
    if (!plan.pipelined()) return lines;
    // Rank 0's stage: the rank that prints.
    std::string blocks;
    for (const PipelineChunk& chunk : plan.stage_chunks(0)) {
        std::vector<std::string> parts;
        if (chunk.embedding) parts.emplace_back("E");
        if (chunk.num_layers > 0)
            parts.push_back(
                fmt::format("t{}-{}", chunk.first_layer, chunk.first_layer + chunk.num_layers - 1));
        if (chunk.num_mtp > 0) parts.emplace_back(static_cast<size_t>(chunk.num_mtp), 'm');
        if (chunk.loss) parts.emplace_back("L");
        if (!blocks.empty()) blocks += " | ";
        for (size_t i = 0; i < parts.size(); ++i) blocks += (i > 0 ? " " : "") + parts[i];
    }
    const std::vector<PipelineAction> order =
        pipeline_order(plan.schedule, t.pp, /*stage=*/0, plan.grad_accum, t.vpp);
    lines.push_back(fmt::format(
        "        pipeline: pp{} x vpp{}, {} schedule, {} micro-batches; this rank's stage runs {}, "
        "keeping up to {} in flight",
        t.pp, t.vpp, pipeline_schedule_name(plan.schedule), plan.grad_accum, blocks,
        max_in_flight(order)));
    return lines;
}

}  // namespace moetron
