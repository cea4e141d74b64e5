// sim/step, sim/memory, sim/report, sim/svg: a simulated step is self-consistent (the breakdown
// adds up to the step, overlap never slows a step down, memory adds up), impossible inputs and
// out-of-memory layouts are rejected with a message that says why and by how much, and the
// reports render.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/model/config.h"
#include "moetron/sim/report.h"
#include "moetron/sim/step.h"
#include "moetron/sim/svg.h"
#include "moetron/sim/time_to_train.h"

namespace moetron::sim {
namespace {

const std::string kRoot = MOETRON_SOURCE_DIR;

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

struct Fixture {
    ModelConfig dsv3 = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    ClusterSpec gb300 = load_cluster_spec(kRoot + "/configs/clusters/gb300-nvl72.toml");
    ClusterSpec h100 = load_cluster_spec(kRoot + "/configs/clusters/h100-hgx.toml");

    SimOptions gb300_options() const {
        SimOptions o;
        o.precision = Precision::mxfp8;
        o.seq_len = 4096;
        o.global_batch = 4096;
        o.micro_batch = 1;
        o.count_mtp = false;
        o.recompute = parse_recompute("mlp,moe_act");
        o.cuda_graphs = CudaGraphs::partial;
        return o;
    }
};

// Communication that interferes with compute only slows the step while it runs: on one GPU
// there is no gradient sync, so the share of the compute an overlapping collective takes cannot
// matter (it added the whole last backward before issue 17, 1.7x tiny's step at share 1).
TEST(SimStep, OverlapInterferenceNeedsACollective) {
    Fixture f;
    const ModelConfig tiny = load_model_config(kRoot + "/configs/models/tiny.toml");
    SimOptions o;
    o.precision = Precision::bf16;
    o.seq_len = 64;
    o.global_batch = 8;
    o.micro_batch = 8;
    ClusterSpec none = f.h100, all = f.h100;
    none.efficiency.comm_sm_fraction = 0;
    all.efficiency.comm_sm_fraction = 1;
    const auto layout = parallel::parse_layout("tp1", 1);
    EXPECT_DOUBLE_EQ(simulate_step(tiny, all, layout, o).step_time_s,
                     simulate_step(tiny, none, layout, o).step_time_s);
}

TEST(SimStep, BreakdownAddsUpToTheStep) {
    Fixture f;
    const StepResult r = simulate_step(
        f.dsv3, f.gb300, parallel::parse_layout("tp1.pp2.vpp4.ep32", 256), f.gb300_options());
    EXPECT_NEAR(r.breakdown.total_s(), r.step_time_s, 1e-9 * r.step_time_s);
    EXPECT_EQ(r.micro_batches, 32);
    EXPECT_NEAR(r.tokens_per_s_per_gpu * r.step_time_s * 256, 4096.0 * 4096, 1);
    EXPECT_NEAR(r.tflops_per_gpu, r.tokens_per_s_per_gpu * r.model_flops_per_token / 1e12, 1e-9);
    EXPECT_GT(r.mfu, 0.05);
    EXPECT_LT(r.mfu, 0.6);
    // Every main layer sits in exactly one model chunk.
    std::vector<int> seen(61, 0);
    for (const auto& chunk : r.stage_layers) {
        for (int layer : chunk) ++seen.at(static_cast<size_t>(layer));
    }
    for (int count : seen) EXPECT_EQ(count, 1);
    EXPECT_EQ(r.memory_per_stage.size(), 2u);
}

TEST(SimStep, OverlapAndGraphsNeverSlowAStepDown) {
    Fixture f;
    const parallel::Layout l = parallel::parse_layout("tp1.pp2.vpp4.ep32", 256);
    const SimOptions base = f.gb300_options();
    const double t0 = simulate_step(f.dsv3, f.gb300, l, base).step_time_s;
    SimOptions o = base;
    o.moe_overlap = MoeOverlap::dual;
    const double t_ep = simulate_step(f.dsv3, f.gb300, l, o).step_time_s;
    EXPECT_LT(t_ep, t0);
    o.cuda_graphs = CudaGraphs::full;
    EXPECT_LE(simulate_step(f.dsv3, f.gb300, l, o).step_time_s, t_ep);
    SimOptions no_dp = base;
    no_dp.overlap_dp_grad = false;
    no_dp.overlap_dp_param = false;
    EXPECT_GT(simulate_step(f.dsv3, f.gb300, l, no_dp).step_time_s, t0);
    SimOptions no_graphs = base;
    no_graphs.cuda_graphs = CudaGraphs::none;
    EXPECT_GE(simulate_step(f.dsv3, f.gb300, l, no_graphs).step_time_s, t0);
}

TEST(SimStep, RecomputeTradesTimeForMemory) {
    Fixture f;
    const parallel::Layout l = parallel::parse_layout("tp1.pp2.vpp4.ep32", 256);
    SimOptions light = f.gb300_options();
    light.recompute = parse_recompute("none");
    SimOptions heavy = light;
    heavy.recompute = parse_recompute("full");
    const StepResult a = simulate_step_unchecked(f.dsv3, f.gb300, l, light);
    const StepResult b = simulate_step_unchecked(f.dsv3, f.gb300, l, heavy);
    EXPECT_LT(b.memory.activations_bytes, 0.2 * a.memory.activations_bytes);
    EXPECT_GT(b.step_time_s, a.step_time_s);
    EXPECT_GT(b.breakdown.recompute_s, 0.1 * b.step_time_s);
}

TEST(SimStep, OutOfMemorySaysByHowMuch) {
    Fixture f;
    // All of DeepSeek-V3 on 8 H100s cannot fit.
    SimOptions o;
    o.precision = Precision::fp8_blockwise;
    o.global_batch = 64;
    const std::string msg = error_of(
        [&] { simulate_step(f.dsv3, f.h100, parallel::parse_layout("tp1.pp1.ep8", 8), o); });
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GB over"), std::string::npos) << msg;
    const StepResult r =
        simulate_step_unchecked(f.dsv3, f.h100, parallel::parse_layout("tp1.pp1.ep8", 8), o);
    EXPECT_GT(r.memory.total_bytes(), 10 * r.memory.capacity_bytes);
}

TEST(SimStep, ImpossibleInputsAreRejected) {
    Fixture f;
    const parallel::Layout l = parallel::parse_layout("tp1.pp2.vpp4.ep32", 256);
    SimOptions o = f.gb300_options();
    o.global_batch = 4000;  // not a multiple of dp 128 x mbs 1
    EXPECT_NE(error_of([&] { simulate_step(f.dsv3, f.gb300, l, o); }).find("global batch"),
              std::string::npos);
    o = f.gb300_options();
    o.global_batch = 128 * 3;  // 3 micro-batches: not a multiple of pp for interleaving
    EXPECT_NE(error_of([&] { simulate_step(f.dsv3, f.gb300, l, o); }).find("multiple of pp"),
              std::string::npos);
    // MXFP8 on an H100.
    SimOptions mx = f.gb300_options();
    mx.global_batch = 8192;
    const std::string msg = error_of([&] {
        simulate_step(f.dsv3, f.h100, parallel::parse_layout("tp2.pp8.vpp4.ep64", 1024), mx);
    });
    EXPECT_NE(msg.find("mxfp8"), std::string::npos) << msg;
    // The engine's shared-expert overlap, which the cluster model does not price.
    SimOptions shared = f.gb300_options();
    shared.moe_overlap = MoeOverlap::shared;
    const std::string unmodelled = error_of([&] { simulate_step(f.dsv3, f.gb300, l, shared); });
    EXPECT_NE(unmodelled.find("do not model --moe-overlap shared"), std::string::npos)
        << unmodelled;
    EXPECT_EQ(unmodelled.find(".cpp:"), std::string::npos) << unmodelled;
    // TP across NVLink domains.
    SimOptions fp8 = mx;
    fp8.precision = Precision::fp8_blockwise;
    EXPECT_NE(error_of([&] {
                  simulate_step(f.dsv3, f.h100, parallel::parse_layout("tp16.pp8.ep64", 1024), fp8);
              }).find("domain"),
              std::string::npos);
    // A Megatron layout string that does not match the model.
    SimOptions bad_layout = f.gb300_options();
    bad_layout.pipeline_layout = "Et|(tt|)*6L";
    EXPECT_NE(error_of([&] { simulate_step(f.dsv3, f.gb300, l, bad_layout); }).find("layers"),
              std::string::npos);
}

TEST(SimStep, DualPipeHoldsTwoStagesAndShrinksTheBubble) {
    // DeepSeek-V3's own run: 2,048 H800, PP16 EP64, DualPipe (report sec. 3.2).
    Fixture f;
    const ClusterSpec h800 = load_cluster_spec(kRoot + "/configs/clusters/h800-hgx.toml");
    SimOptions o;
    o.precision = Precision::fp8_blockwise;
    o.global_batch = 4096;
    o.recompute = parse_recompute("layernorm,mla_up_proj,moe_act");
    const parallel::Layout l = parallel::parse_layout("tp1.pp16.ep64", 2048);
    const StepResult plain = simulate_step_unchecked(f.dsv3, h800, l, o);
    o.pipeline_schedule = PipelineSchedule::dualpipe;
    const StepResult dual = simulate_step_unchecked(f.dsv3, h800, l, o);
    EXPECT_LT(dual.breakdown.pp_bubble_s, 0.5 * plain.breakdown.pp_bubble_s);
    EXPECT_LT(dual.step_time_s, plain.step_time_s);
    // Rank 1 holds stages 1 and 14: two stages' weights and gradients, the optimizer state of
    // one (each copy's share).
    const MemoryBreakdown& p1 = plain.memory_per_stage[1];
    const MemoryBreakdown& d1 = dual.memory_per_stage[1];
    EXPECT_NEAR(d1.weights_bytes, p1.weights_bytes + plain.memory_per_stage[14].weights_bytes, 1e6);
    EXPECT_NEAR(d1.optimizer_bytes,
                (p1.optimizer_bytes + plain.memory_per_stage[14].optimizer_bytes) / 2, 1e6);
    // An odd pp, or interleaving, is refused with a reason.
    const std::string msg = error_of([&] {
        (void)simulate_step_unchecked(f.dsv3, h800,
                                      parallel::parse_layout("tp1.pp16.vpp2.ep64", 2048), o);
    });
    EXPECT_NE(msg.find("dualpipe schedule needs an even pp"), std::string::npos) << msg;
}

TEST(SimStep, EpOverlapWithAPipelineNeedsInterleaving) {
    // Megatron-LM refuses EP all-to-all overlap with pp > 1 and no vpp; simulated anyway, the
    // combined 1F1B pairs chain stage to stage and halve the throughput.
    Fixture f;
    SimOptions o = f.gb300_options();
    o.moe_overlap = MoeOverlap::dual;
    const std::string msg = error_of([&] {
        (void)simulate_step(f.dsv3, f.gb300, parallel::parse_layout("tp1.pp4.ep32", 256), o);
    });
    EXPECT_NE(msg.find("--moe-overlap dual with pp 4 needs interleaving"), std::string::npos)
        << msg;
    EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << msg;
    (void)simulate_step_unchecked(f.dsv3, f.gb300, parallel::parse_layout("tp1.pp4.vpp2.ep32", 256),
                                  o);
    (void)simulate_step_unchecked(f.dsv3, f.gb300, parallel::parse_layout("tp1.pp1.ep32", 256), o);
}

// An evaluation is forward only: one micro-batch per replica crosses the pipeline once (the sum
// of the stages' forwards), each further micro-batch adds the slowest stage's forward, and it
// never costs as much as a training step of the same sequences.
TEST(SimStep, EvaluationIsAForwardThroughThePipeline) {
    Fixture f;
    const StepResult r = simulate_step(
        f.dsv3, f.gb300, parallel::parse_layout("tp1.pp2.vpp4.ep32", 256), f.gb300_options());
    std::vector<double> stage_s(2, 0);
    for (size_t g = 0; g < r.chunk_block_times.size(); ++g) {
        for (const auto& block : r.chunk_block_times[g]) stage_s[g % 2] += block.first;
    }
    const int64_t replicas = r.layout.dp;  // 128, micro-batch 1
    EXPECT_NEAR(evaluation_time_s(r, 1), stage_s[0] + stage_s[1], 1e-12);
    EXPECT_NEAR(evaluation_time_s(r, replicas), stage_s[0] + stage_s[1], 1e-12);
    EXPECT_NEAR(evaluation_time_s(r, 3 * replicas),
                stage_s[0] + stage_s[1] + 2 * std::max(stage_s[0], stage_s[1]), 1e-12);
    EXPECT_LT(evaluation_time_s(r, 4096), r.step_time_s / 2);
    const TimeToTrain t = time_to_train(r, 10, replicas);
    EXPECT_NEAR(t.total_s(), 10 * (r.step_time_s + stage_s[0] + stage_s[1]), 1e-9);
}

TEST(SimStep, ReportsRender) {
    Fixture f;
    const StepResult r = simulate_step(
        f.dsv3, f.gb300, parallel::parse_layout("tp1.pp2.vpp4.ep32", 256), f.gb300_options());
    const std::string text = format_step_report(r);
    for (const char* needle :
         {"tokens/s/GPU", "TFLOPs/GPU", "MFU", "exposed EP", "bubble", "memory per GPU"}) {
        EXPECT_NE(text.find(needle), std::string::npos) << needle;
    }
    const nlohmann::json j = step_report_json(r);
    EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), r.step_time_s);
    EXPECT_EQ(j["memory_per_stage"].size(), 2u);
    const std::string svg = step_timeline_svg(r);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    EXPECT_NE(svg.find("stage 1"), std::string::npos);
    const std::string chart = scaling_svg({{256, 1500, 1.0}, {1024, 1480, 0.987}}, "scaling");
    EXPECT_NE(chart.find("98.7%"), std::string::npos);
    // The y-axis title runs up the left margin: horizontal, it was clipped by the chart's edge
    // and overlapped the tick labels.
    const size_t title_end = chart.find(">TFLOPs/GPU</text>");
    ASSERT_NE(title_end, std::string::npos) << chart;
    const size_t title_start = chart.rfind("<text", title_end);
    EXPECT_NE(chart.substr(title_start, title_end - title_start).find("rotate(-90"),
              std::string::npos)
        << chart.substr(title_start, title_end - title_start);
}

}  // namespace
}  // namespace moetron::sim
