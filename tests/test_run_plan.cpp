// train/run_plan.h: a run's settings resolved once, against the model, the batch and the world
// size, into what the trainer, `train`, bench_train_step and `info` read.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/train/run_plan.h"
#include "tiny_model_config.h"

namespace moetron {
namespace {

using testing::tiny_model_config;

TrainConfig train_config(int64_t batch_size, int64_t grad_accum = 4) {
    TrainConfig c;
    c.batch_size = batch_size;
    c.seq_len = 16;
    c.grad_accum = grad_accum;
    return c;
}

TEST(RunPlan, OneProcessIsAWorldOfOneWithItsDefaults) {
    const RunPlan plan = plan_run(tiny_model_config(), train_config(4), {}, 1);
    EXPECT_EQ(plan.topology.world_size, 1);
    EXPECT_FALSE(plan.pipelined());
    EXPECT_TRUE(plan.chunks.empty());
    EXPECT_EQ(plan.rank_rows, 4);
    EXPECT_EQ(plan.bucket_bytes, 4 << 20);  // --bucket-mb 4, in bytes once
    EXPECT_FALSE(plan.zero1) << "ZeRO-1 over groups of one rank would only add copies";
    EXPECT_EQ(plan.precision, Precision::fp32);
    EXPECT_TRUE(describe_run_plan(plan, train_config(4)).empty());
}

TEST(RunPlan, TheTokensTravelInTheRecipesFormatUnlessAskedForFloat32) {
    RunSettings s;
    s.precision = Precision::mxfp8;
    EXPECT_EQ(plan_run(tiny_model_config(), train_config(4), s, 1).moe.token_format,
              Precision::mxfp8);
    s.dispatch_payload = parallel::DispatchPayload::activation;
    const RunPlan fp32_payload = plan_run(tiny_model_config(), train_config(4), s, 1);
    EXPECT_EQ(fp32_payload.moe.token_format, Precision::fp32);
    EXPECT_EQ(fp32_payload.precision, Precision::mxfp8);
}

TEST(RunPlan, DataParallelRanksSplitTheBatchAndShardTheOptimizer) {
    RunSettings s;
    s.layout = "dp2";
    s.bucket_mb = 0.5;
    const RunPlan plan = plan_run(tiny_model_config(), train_config(4), s, 2);
    EXPECT_EQ(plan.rank_rows, 2);
    EXPECT_TRUE(plan.zero1);
    EXPECT_EQ(plan.bucket_bytes, 512 * 1024);
    const std::vector<std::string> lines = describe_run_plan(plan, train_config(4));
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_NE(lines[0].find("ZeRO-1 optimizer, 0.5 MiB gradient buckets"), std::string::npos)
        << lines[0];
    EXPECT_NE(lines[1].find("2 of the 4 sequences"), std::string::npos) << lines[1];
    s.zero1 = false;
    EXPECT_FALSE(plan_run(tiny_model_config(), train_config(4), s, 2).zero1);
}

TEST(RunPlan, APipelineHasItsScheduleAndEachStageItsChunks) {
    RunSettings s;
    s.layout = "pp2";
    s.pp_schedule = "zb-h1";
    const RunPlan zb = plan_run(tiny_model_config(), train_config(4), s, 2);
    EXPECT_EQ(zb.schedule, PipelineScheduleKind::zero_bubble_h1);
    EXPECT_TRUE(zb.split_backward);
    ASSERT_EQ(zb.chunks.size(), 2u);
    EXPECT_TRUE(zb.stage_chunks(0)[0].embedding);
    EXPECT_TRUE(zb.stage_chunks(1)[0].loss);
    EXPECT_EQ(zb.stage_in_flight(0).size(), 1u);
    EXPECT_NE(describe_run_plan(zb, train_config(4)).back().find("zb-h1 schedule"),
              std::string::npos);

    // Two chunks per stage: the interleaved schedule, chunks s and s + pp on stage s.
    s.layout = "pp2.vpp2";
    s.pp_schedule = "1f1b";
    const RunPlan interleaved = plan_run(tiny_model_config(), train_config(4), s, 2);
    EXPECT_EQ(interleaved.schedule, PipelineScheduleKind::interleaved);
    EXPECT_FALSE(interleaved.split_backward);
    ASSERT_EQ(interleaved.chunks.size(), 4u);
    const std::vector<PipelineChunk> stage1 = interleaved.stage_chunks(1);
    ASSERT_EQ(stage1.size(), 2u);
    EXPECT_EQ(stage1[0].first_layer, interleaved.chunks[1].first_layer);
    EXPECT_EQ(stage1[1].first_layer, interleaved.chunks[3].first_layer);
}

TEST(RunPlan, WhatCannotRunIsRefusedBeforeAnythingIsBuilt) {
    const ModelConfig model = tiny_model_config();
    auto refusal = [&](const RunSettings& s, const TrainConfig& c, int world) {
        try {
            plan_run(model, c, s, world);
        } catch (const UserError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    RunSettings s;
    s.layout = "dp2";
    EXPECT_NE(refusal(s, train_config(3), 2).find("do not split"), std::string::npos);
    s = {};
    s.pp_schedule = "gpipe";
    EXPECT_NE(refusal(s, train_config(4), 1).find("gpipe"), std::string::npos);
    s = {};
    s.pp_layout = "Et|ttmL";  // two chunks for one stage, refused without pp too
    EXPECT_NE(refusal(s, train_config(4), 1), "no error");
    s = {};
    s.moe.rebalance_every = 10;
    EXPECT_NE(refusal(s, train_config(4), 1).find("--rebalance-every"), std::string::npos);
    s = {};
    s.bucket_mb = 0;
    EXPECT_NE(refusal(s, train_config(4), 1).find("--bucket-mb"), std::string::npos);
    s = {};
    s.precision = Precision::nvfp4;
    EXPECT_EQ(refusal(s, train_config(4), 1),
              "the engine has no NVFP4 recipe yet; simulate and plan price it");
}

TEST(RunPlan, ItsMemoryIsTheEnginesPlanForItsRanks) {
    RunSettings s;
    s.layout = "ep2";
    s.moe.redundant_experts = 2;
    const TrainConfig c = train_config(4);
    const RunPlan plan = plan_run(tiny_model_config(), c, s, 2);
    ModelRuntime runtime;
    runtime.batch_size = plan.rank_rows;
    runtime.seq_len = c.seq_len;
    const RankMemoryPlan want =
        plan_rank_memory(tiny_model_config(), runtime, plan.topology, plan.moe, plan.zero1);
    const RankMemoryPlan got = plan_run_memory(tiny_model_config(), c, plan);
    EXPECT_EQ(got.parameters, want.parameters);
    EXPECT_EQ(got.communication, want.communication);
    EXPECT_EQ(got.expert_rows, want.expert_rows);
    // The spare slots are planned: more parameters than without them.
    s.moe.redundant_experts = 0;
    EXPECT_GT(
        got.parameters,
        plan_run_memory(tiny_model_config(), c, plan_run(tiny_model_config(), c, s, 2)).parameters);
}

}  // namespace
}  // namespace moetron
