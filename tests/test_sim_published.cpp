// The cluster model against published DeepSeek-V3 671B pre-training throughput (seq 4096,
// dropless routing with balanced token distribution), from one efficiency set per
// architecture (configs/clusters/efficiency/{hopper,blackwell}.toml). Prints predicted vs
// published and the error, and asserts each within 10%.
//
// Software assumed for each point (the options, not the efficiency, change between points):
//  - GB300 1,088 (earlier software): DeepEP/HybridEP-class two-tier dispatch in bf16, partial
//    CUDA graphs (attention, router, preprocess, shared expert), no EP overlap, recompute
//    mlp + moe_act (Megatron-LM's GB200 guide, docs/discussions/deepseek-v3-gb200-optimization).
//  - H100 338: the published recipe (Megatron-MoE-ModelZoo best_practice/DeepSeekV3/run.sh):
//    DeepEP, EP all-to-all overlap, recompute mla_up_proj + mlp, one MTP layer (counted),
//    pipeline layout Et|(tt|)*30mL, no CUDA graphs.
//  - GB300 1,648 (later software): full CUDA graphs (sync-free MoE), EP overlap, MXFP8
//    dispatch; layout, micro-batch and recompute are the planner's best.
//  - 256 -> 1,024 GB300: the later software and the planner's layout, global batch x4.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/sim/planner.h"
#include "moetron/sim/report.h"
#include "moetron/sim/step.h"
#include "moetron/sim/time_to_train.h"

namespace moetron::sim {
namespace {

const std::string kRoot = MOETRON_SOURCE_DIR;

struct Row {
    std::string what;
    std::string unit;
    double predicted = 0;
    double published = 0;
    bool fitted = false;  // a parameter was fitted to this point (else held out)
    double error() const { return predicted / published - 1; }
};

class Published : public ::testing::Test {
  protected:
    static void TearDownTestSuite() {
        std::printf("\n  %-58s %-14s %10s %10s %8s  %s\n", "DeepSeek-V3 671B, seq 4096", "",
                    "predicted", "published", "error", "");
        for (const Row& r : rows()) {
            std::printf("  %-58s %-14s %10.1f %10.1f %+7.1f%%  %s\n", r.what.c_str(),
                        r.unit.c_str(), r.predicted, r.published, 100 * r.error(),
                        r.fitted ? "fitted" : "held out");
        }
        std::printf("\n");
    }
    static std::vector<Row>& rows() {
        static std::vector<Row> r;
        return r;
    }
    static void record(const Row& r, double tolerance = 0.10) {
        rows().push_back(r);
        EXPECT_LT(std::fabs(r.error()), tolerance) << r.what << " " << r.unit;
    }

    ModelConfig dsv3 = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    ClusterSpec gb300 = load_cluster_spec(kRoot + "/configs/clusters/gb300-nvl72.toml");
    ClusterSpec h100 = load_cluster_spec(kRoot + "/configs/clusters/h100-hgx.toml");

    SimOptions later_software() const {
        SimOptions o;
        o.precision = Precision::mxfp8;
        o.seq_len = 4096;
        o.global_batch = 4096;
        o.count_mtp = false;
        o.cuda_graphs = CudaGraphs::full;
        o.moe_overlap = MoeOverlap::dual;
        o.dispatch_payload = parallel::DispatchPayload::recipe;
        return o;
    }

    // The default search space around the winners (tp 1-2, pp 1-4), to keep the test fast;
    // `moetron plan` searches the full space and picks the same layout.
    static PlanSpace test_space() {
        PlanSpace s;
        s.tp = {1, 2};
        s.pp = {1, 2, 4};
        s.ep = {16, 32, 64, 128};
        return s;
    }
};

TEST_F(Published, Gb300EarlierSoftware) {
    SimOptions o;
    o.precision = Precision::mxfp8;
    o.seq_len = 4096;
    o.global_batch = 4096;
    o.micro_batch = 1;
    o.count_mtp = false;
    o.recompute = parse_recompute("mlp,moe_act");
    o.cuda_graphs = CudaGraphs::partial;
    const StepResult r =
        simulate_step(dsv3, gb300, parallel::parse_layout("tp1.pp2.vpp4.ep32", 256), o);
    record({"256 GB300 MXFP8 TP1 PP2 VPP4 EP32 gbs4096 (MTP not counted)", "tokens/s/GPU",
            r.tokens_per_s_per_gpu, 4357, true});
    record({"  same", "TFLOPs/GPU", r.tflops_per_gpu, 1088, true});
}

TEST_F(Published, H100) {
    SimOptions o;
    o.precision = Precision::fp8_blockwise;
    o.seq_len = 4096;
    o.global_batch = 8192;
    o.micro_batch = 1;
    o.count_mtp = true;
    o.recompute = parse_recompute("mla_up_proj,mlp");
    o.moe_overlap = MoeOverlap::dual;
    o.pipeline_layout = "Et|(tt|)*30mL";
    const StepResult r =
        simulate_step(dsv3, h100, parallel::parse_layout("tp2.pp8.vpp4.ep64", 1024), o);
    record({"1024 H100 FP8 TP2 PP8 VPP4 EP64 gbs8192 (MTP counted)", "tokens/s/GPU",
            r.tokens_per_s_per_gpu, 1297, true});
    record({"  same", "TFLOPs/GPU", r.tflops_per_gpu, 338, true});
}

TEST_F(Published, Gb300LaterSoftwareAndScaling) {
    const PlanResult plan = plan_layouts(dsv3, gb300, 256, later_software(), test_space());
    ASSERT_FALSE(plan.ranked.empty());
    const StepResult& best = plan.ranked.front().result;
    std::printf("  planner's best on 256 GB300: %s\n", describe_options(best).c_str());
    record({"256 GB300 MXFP8 later software, planner's best layout", "TFLOPs/GPU",
            best.tflops_per_gpu, 1648});

    parallel::Layout wide = best.layout;
    wide.dp *= 4;
    SimOptions o = best.options;
    o.global_batch *= 4;
    const StepResult at_1024 = simulate_step(dsv3, gb300, wide, o);
    const double kept_1024 = 100 * at_1024.tflops_per_gpu / best.tflops_per_gpu;
    record({"256 -> 1024 GB300, per-GPU throughput kept (gbs x4)", "%", kept_1024, 98.5, true});
    EXPECT_NEAR(kept_1024, 98.5, 1.5);

    // The curve bends: each doubling beyond 1,024 GPUs loses more than one below it.
    std::vector<double> kept;
    for (int64_t gpus : {256, 1024, 4096, 8192}) {
        parallel::Layout l = best.layout;
        l.dp = gpus / (l.tp * l.cp * l.pp);
        SimOptions scaled = best.options;
        scaled.global_batch = best.options.global_batch * gpus / 256;
        kept.push_back(simulate_step(dsv3, gb300, l, scaled).tflops_per_gpu / best.tflops_per_gpu);
    }
    std::printf(
        "  weak scaling kept at 256 / 1,024 / 4,096 / 8,192 GB300: %.1f%% %.1f%% %.1f%% "
        "%.1f%%\n",
        100 * kept[0], 100 * kept[1], 100 * kept[2], 100 * kept[3]);
    const double per_doubling_low = (kept[0] - kept[1]) / 2,
                 per_doubling_mid = (kept[1] - kept[2]) / 2;
    EXPECT_GT(per_doubling_mid, per_doubling_low);
    EXPECT_LT(kept[3], kept[2]);
}

// DeepSeek's own run (report sec. 3.1-3.3): 2,048 H800, PP16 EP64 over 8-GPU nodes, ZeRO-1 DP,
// DualPipe with all-to-all overlap, FP8 GEMMs, recompute of the RMSNorms and MLA up-projections
// and the SwiGLU output (its input cached in FP8, sec. 3.3.2), fp32 master weights and
// gradients with bf16 moments (sec. 3.3.3), global batch 15,360, one MTP layer. Published: 180K
// H800 GPU hours per trillion tokens (sec. 1), 1,543 tokens/s/GPU. It must fit in memory.
TEST_F(Published, DeepSeekOwnRunOnH800) {
    const ClusterSpec h800 = load_cluster_spec(kRoot + "/configs/clusters/h800-hgx.toml");
    SimOptions o;
    o.precision = Precision::fp8_blockwise;
    o.global_batch = 15360;
    o.recompute = parse_recompute("layernorm,mla_up_proj,moe_act");
    o.moe_overlap = MoeOverlap::dual;
    o.pipeline_schedule = PipelineSchedule::dualpipe;
    o.memory.low_precision_swiglu_input = true;
    const StepResult r =
        simulate_step(dsv3, h800, parallel::parse_layout("tp1.pp16.ep64", 2048), o);
    record({"2048 H800 FP8 PP16 EP64 DualPipe gbs15360 (DeepSeek's run)", "tokens/s/GPU",
            r.tokens_per_s_per_gpu, 1e12 / (180e3 * 3600)});
}

// Told DualPipe, the planner lands on DeepSeek's own layout (pipeline 16, experts over 64 GPUs
// of 8 nodes), and it never offers a layout a schedule cannot run.
TEST_F(Published, PlannerWithDualPipeFindsDeepSeeksLayout) {
    const ClusterSpec h800 = load_cluster_spec(kRoot + "/configs/clusters/h800-hgx.toml");
    SimOptions o;
    o.precision = Precision::fp8_blockwise;
    o.global_batch = 15360;
    o.moe_overlap = MoeOverlap::dual;
    o.pipeline_schedule = PipelineSchedule::dualpipe;
    o.memory.low_precision_swiglu_input = true;
    PlanSpace space;
    space.tp = {1, 2};
    space.pp = {4, 8, 16};
    space.ep = {32, 64};
    space.cp = {1};
    space.micro_batch = {1};
    const PlanResult plan = plan_layouts(dsv3, h800, 2048, o, space);
    ASSERT_FALSE(plan.ranked.empty());
    for (const PlanCandidate& c : plan.ranked) EXPECT_EQ(c.result.layout.vpp, 1);
    const parallel::Layout& best = plan.ranked.front().result.layout;
    std::printf("  DualPipe on 2,048 H800: the planner picks %s, recompute %s\n",
                best.str().c_str(), plan.ranked.front().recompute.c_str());
    EXPECT_EQ(best.tp, 1);
    EXPECT_EQ(best.pp, 16);
    EXPECT_EQ(best.ep, 64);
    o.pipeline_schedule = PipelineSchedule::zero_bubble_h1;  // not with --moe-overlap dual
    EXPECT_EQ(plan_layouts(dsv3, h800, 2048, o, space).considered, 0);
}

// MLPerf Training 6.0, DeepSeek-V3 671B. The rules (mlcommons/training, deepseek_v3 reference
// README): warm-started checkpoint, C4, seq 4,096, global batch >= 15,360, evaluation of the
// first 1,024 validation sequences after every step, target validation loss 3.60. The number of
// steps comes from the reference convergence points (mlcommons/logging,
// rcp_checker/training_6.1.0/rcps_deepseekv3_671b.json, "Reference RCPs before 6.0
// submission"): six reference runs at global batch
// 15,360 converged after 721,920, 721,920, 721,920, 737,280, 691,200 and 737,280 samples, a
// mean of 719,360 = 46.83 steps (at 16,384 and 18,432 also ~47 steps). Published (CoreWeave,
// GB300 NVL72 on Spectrum-X, MXFP8): 5.54, 3.09 and 2.02 minutes on 2,048, 4,096 and 8,192
// GPUs. Held out: nothing was fitted to these points. Assumed: the minimum global batch
// 15,360, MTP trained (the benchmark's 2-token objective), the later software of the 1,648 point,
// and the planner's best layout (restricted to the space the winners come from, for speed).
TEST_F(Published, MlperfDeepSeekV3StrongScaling) {
    const ClusterSpec cluster =
        load_cluster_spec(kRoot + "/configs/clusters/gb300-nvl72-spectrum-x.toml");
    const double steps = 719360.0 / 15360.0;
    SimOptions o = later_software();
    o.global_batch = 15360;
    o.count_mtp = true;
    PlanSpace space;
    space.tp = {1, 2, 4};
    space.pp = {1, 2, 4};
    space.vpp = {1, 4};
    space.ep = {64, 128};
    space.micro_batch = {1};
    space.recompute = {"none"};
    struct Point {
        int64_t gpus;
        double published_minutes;
    };
    std::vector<double> minutes;
    for (const Point& p : {Point{2048, 5.54}, Point{4096, 3.09}, Point{8192, 2.02}}) {
        const PlanResult plan = plan_layouts(dsv3, cluster, p.gpus, o, space);
        ASSERT_FALSE(plan.ranked.empty());
        const StepResult& best = plan.ranked.front().result;
        const TimeToTrain t = time_to_train(best, steps, 1024);
        std::printf(
            "  MLPerf DeepSeek-V3 on %lld GB300: %s, %.1f steps x (step %.2f s + evaluation "
            "%.2f s) = %.2f min (published %.2f)\n",
            static_cast<long long>(p.gpus), best.layout.str().c_str(), t.steps, t.step_s,
            t.evaluation_s, t.total_s() / 60, p.published_minutes);
        minutes.push_back(t.total_s() / 60);
        record({fmt::format("MLPerf 6.0 {} GB300 gbs15360, 47 steps (RCP)", p.gpus), "min to train",
                t.total_s() / 60, p.published_minutes},
               0.25);
    }
    // More GPUs train faster, but less than in proportion (strong scaling).
    EXPECT_LT(minutes[1], minutes[0]);
    EXPECT_LT(minutes[2], minutes[1]);
    EXPECT_GT(minutes[2], minutes[0] / 4);
}

// The planner ranks, not rejects, the layouts the published runs used: restricted to each
// run's layout and micro-batch, with its default recompute presets (which must include the
// recipe's own), the search keeps the recipe's candidate.
// The activation term against a measurement (issue 17). Megatron-LM PR #1913 (fine-grained
// activation offloading, NVIDIA and rednote; the same logs are in the feature's design note)
// benchmarks a "DeepSeek-V3-Proxy" on H100: 14 DeepSeek-V3 layers, all MoE, TP1 PP4 EP16 (64
// GPUs), MBS 1, GBS 512, bf16, DeepEP, no recompute, and logs memory per pipeline stage. Ranks
// 0, 16, 32, 48 (stages 0-3) after 10 iterations, MB = MiB: allocated 24761.0 / 18907.7 /
// 18907.8 / 29006.8, max allocated 65203.9 / 52228.2 / 45200.8 / 48166.3.
// max - allocated is the activation peak plus transient buffers; under 1F1B stage s holds
// pp - s micro-batches, so the step from one stage to the next is one micro-batch of one
// stage's layers, transients cancelling: 7122.5, 7027.3 and 7133.7 MiB. The first two being
// equal needs equal layer counts on stages 0-2, so the layers sit 4/4/4/2 (the last step also
// holds the last stage's logits); those two steps average 7074.9 MiB, the activations of one
// micro-batch through four layers. Not stated,
// assumed: seq 4096 (DeepSeek-V3's; the offloaded run's saving, 801 MiB per layer and
// micro-batch for the fc1 input, the SwiGLU input and both norm inputs, is what those tensors
// take at seq 4096 and top-8 within 2%) and no MTP. Nothing was fitted to this point.
TEST_F(Published, ActivationsOfMegatronsDeepSeekV3Proxy) {
    ModelConfig proxy = dsv3;
    proxy.num_hidden_layers = 14;
    proxy.first_k_dense_replace = 0;
    proxy.num_nextn_predict_layers = 0;
    SimOptions o;
    o.precision = Precision::bf16;
    o.seq_len = 4096;
    o.global_batch = 512;
    o.micro_batch = 1;
    o.count_mtp = false;
    o.pipeline_layout = "Etttt|tttt|tttt|ttL";
    // The static terms do not enter the comparison; bf16 gradients and moments make it fit.
    o.memory.optimizer.main_grad_bytes = 2;
    const StepResult r = simulate_step(proxy, h100, parallel::parse_layout("tp1.pp4.ep16", 64), o);
    ASSERT_EQ(r.memory_per_stage.size(), 4u);
    const auto act = [&](int s) { return r.memory_per_stage[s].activations_bytes; };
    const double mib = 1024.0 * 1024.0;
    const double step_mib = (act(0) - act(2)) / 2 / mib;
    record({"DeepSeek-V3-Proxy H100 TP1 PP4 EP16 bf16: 4 layers, 1 micro-batch", "MiB activation",
            step_mib, 7074.9},
           0.05);
}

TEST_F(Published, PlannerRanksThePublishedLayouts) {
    struct Run {
        const char* what;
        const ClusterSpec* cluster;
        int64_t gpus;
        const char* layout;
        const char* recompute;
        SimOptions options;
    };
    SimOptions gb300_1088;
    gb300_1088.precision = Precision::mxfp8;
    gb300_1088.global_batch = 4096;
    gb300_1088.count_mtp = false;
    gb300_1088.cuda_graphs = CudaGraphs::partial;
    SimOptions h100_338;
    h100_338.precision = Precision::fp8_blockwise;
    h100_338.global_batch = 8192;
    h100_338.moe_overlap = MoeOverlap::dual;
    h100_338.pipeline_layout = "Et|(tt|)*30mL";
    // Megatron-Bridge's B200 DeepSeek-V3 base config (256 GPUs, PP16 EP8, gbs 2048, recompute
    // mla_up_proj, HybridEP, no all-to-all overlap).
    SimOptions b200_recipe;
    b200_recipe.precision = Precision::mxfp8;
    b200_recipe.global_batch = 2048;
    const ClusterSpec b200 = load_cluster_spec(kRoot + "/configs/clusters/b200-hgx.toml");
    for (const Run& run :
         {Run{"GB300 1,088", &gb300, 256, "tp1.pp2.vpp4.ep32", "mlp,moe_act", gb300_1088},
          Run{"H100 338", &h100, 1024, "tp2.pp8.vpp4.ep64", "mla_up_proj,mlp", h100_338},
          Run{"B200 recipe", &b200, 256, "tp1.pp16.ep8", "mla_up_proj", b200_recipe},
          Run{"GB300 later software", &gb300, 256, "tp1.pp2.vpp4.ep32", "mlp,moe_act",
              later_software()}}) {
        const parallel::Layout l = parallel::parse_layout(run.layout, run.gpus);
        PlanSpace space;  // the default recompute presets
        space.tp = {l.tp};
        space.pp = {l.pp};
        space.vpp = {l.vpp};
        space.ep = {l.ep};
        space.cp = {1};
        space.micro_batch = {1};
        const PlanResult plan = plan_layouts(dsv3, *run.cluster, run.gpus, run.options, space);
        const PlanCandidate* found = nullptr;
        for (const PlanCandidate& c : plan.ranked) {
            if (c.recompute == run.recompute) found = &c;
        }
        ASSERT_NE(found, nullptr) << run.what << ": " << run.layout << " recompute "
                                  << run.recompute << " is not ranked";
        const MemoryBreakdown& m = found->result.memory;
        std::printf("  %-22s %-20s %-16s fits: %.1f of %.1f GB\n", run.what, run.layout,
                    run.recompute, m.total_bytes() / 1e9, m.capacity_bytes / 1e9);
    }
}

}  // namespace
}  // namespace moetron::sim
