// The cluster model priced with routing imbalance (issue 15): an expert-load histogram
// (sim/expert_imbalance.h) slows the busiest EP rank's expert compute and all-to-all receive,
// redundant expert slots (--redundant-experts R) relieve it and cost memory, and `moetron
// simulate` / `moetron plan` take both and report them.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli_run.h"
#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/sim/expert_imbalance.h"
#include "moetron/sim/step.h"
#include "temp_dir.h"

namespace moetron::sim {
namespace {

const std::string kRoot = MOETRON_SOURCE_DIR;

struct Fixture {
    ModelConfig dsv3 = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    ClusterSpec gb300 = load_cluster_spec(kRoot + "/configs/clusters/gb300-nvl72.toml");
    parallel::Layout layout = parallel::parse_layout("tp1.pp2.vpp4.ep32", 256);

    SimOptions options() const {
        SimOptions o;
        o.precision = Precision::mxfp8;
        o.seq_len = 4096;
        o.global_batch = 4096;
        o.count_mtp = false;
        o.recompute = parse_recompute("mlp,moe_act");
        o.cuda_graphs = CudaGraphs::partial;
        return o;
    }
    StepResult step(const SimOptions& o) const {
        return simulate_step_unchecked(dsv3, gb300, layout, o);
    }
};

TEST(SimRoutingImbalance, BalancedLoadsLeaveTheStepBitIdentical) {
    Fixture f;
    const StepResult plain = f.step(f.options());
    SimOptions o = f.options();
    o.expert_loads = zipf_expert_loads(256, 0.0);  // every expert the same load
    const StepResult balanced = f.step(o);
    EXPECT_EQ(balanced.expert_imbalance, 1.0);
    EXPECT_EQ(balanced.step_time_s, plain.step_time_s);
    EXPECT_EQ(balanced.memory.total_bytes(), plain.memory.total_bytes());
}

TEST(SimRoutingImbalance, SkewSlowsTheStepAndRedundantExpertsWinItBack) {
    Fixture f;
    const StepResult balanced = f.step(f.options());
    SimOptions o = f.options();
    o.expert_loads = zipf_expert_loads(256, 1.0);
    const StepResult skewed = f.step(o);
    // Experts 0-7 (the hottest) all sit on EP rank 0.
    EXPECT_GT(skewed.expert_imbalance, 3.0);
    EXPECT_GT(skewed.step_time_s, 1.2 * balanced.step_time_s);
    EXPECT_GT(skewed.breakdown.gemm_s, balanced.breakdown.gemm_s);

    o.redundant_experts = 32;  // R = ep: one spare slot per rank
    const StepResult relieved = f.step(o);
    EXPECT_LT(relieved.expert_imbalance, 1.2);
    EXPECT_LT(relieved.step_time_s, skewed.step_time_s);
    // Most of the way back: within a fifth of what the skew cost.
    EXPECT_LT(relieved.step_time_s - balanced.step_time_s,
              0.2 * (skewed.step_time_s - balanced.step_time_s));
}

TEST(SimRoutingImbalance, RedundantSlotsHoldWholeExperts) {
    Fixture f;
    const StepResult without = f.step(f.options());
    SimOptions o = f.options();
    o.redundant_experts = 32;
    const StepResult with = f.step(o);
    const MemoryBreakdown& a = without.memory;
    const MemoryBreakdown& b = with.memory;
    EXPECT_GT(b.weights_bytes, a.weights_bytes);
    EXPECT_GT(b.grads_bytes, a.grads_bytes);
    EXPECT_GT(b.optimizer_bytes, a.optimizer_bytes);
    // Each rank holds 9 expert slots instead of 8 in its MoE layers: one ninth more of the
    // 8 experts' parameters, times the stage's MoE layers (the fullest stage's count).
    const double expert_params_per_layer = 8.0 * 3 * 7168 * 2048;
    const double extra_layers = (b.params - a.params) / (expert_params_per_layer / 8);
    EXPECT_NEAR(extra_layers, std::round(extra_layers), 1e-6);
    EXPECT_GE(extra_layers, 1.0);
    // Balanced loads: the spare slots change no rank's token count.
    EXPECT_EQ(with.expert_imbalance, 1.0);
}

TEST(SimRoutingImbalance, BadInputsAreTheUsersMistake) {
    Fixture f;
    SimOptions o = f.options();
    o.redundant_experts = 3;  // 259 slots over 32 ranks
    EXPECT_THROW(f.step(o), UserError);
    o.redundant_experts = 0;
    o.expert_loads = zipf_expert_loads(64, 1.0);  // another model's histogram
    EXPECT_THROW(f.step(o), UserError);
    EXPECT_THROW(expert_loads_from_spec("zipf:x", 256), UserError);
    EXPECT_THROW(expert_loads_from_spec("zipf:-1", 256), UserError);

    testing::TempDir dir;
    const std::string missing = (dir.path() / "missing.jsonl").string();
    try {
        expert_loads_from_spec(missing, 256);
        ADD_FAILURE() << "a missing file was accepted";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
    const std::string no_loads = (dir.path() / "no_loads.jsonl").string();
    std::ofstream(no_loads) << "{\"step\":1,\"loss\":5}\n";
    try {
        expert_loads_from_spec(no_loads, 256);
        ADD_FAILURE() << "a log without loads was accepted";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find(no_loads), std::string::npos) << e.what();
    }
}

TEST(SimRoutingImbalance, SimulateAndPlanTakeAndReportIt) {
    const std::string simulate =
        "simulate --config dsv3-671b --cluster gb300-nvl72 --gpus 256 --layout tp1.pp2.vpp4.ep32 "
        "--gbs 4096 --precision mxfp8 --recompute mlp,moe_act --cuda-graphs partial "
        "--no-count-mtp --expert-imbalance zipf:0.2";
    const testing::CliOutput skewed = testing::run_cli(simulate);
    ASSERT_EQ(skewed.exit_code, 0) << skewed.text;
    EXPECT_CONTAINS(skewed.text, "routing imbalance: tokens per EP rank max/mean");
    EXPECT_CONTAINS(skewed.text, "experts split contiguously");

    const testing::CliOutput relieved = testing::run_cli(simulate + " --redundant-experts 32");
    ASSERT_EQ(relieved.exit_code, 0) << relieved.text;
    EXPECT_CONTAINS(relieved.text, "32 redundant experts");
    EXPECT_CONTAINS(relieved.text, "redundant experts: step");

    const testing::CliOutput bad_r = testing::run_cli(simulate + " --redundant-experts 3");
    EXPECT_NE(bad_r.exit_code, 0);
    EXPECT_CONTAINS(bad_r.text, "multiple of 32");
    EXPECT_EQ(bad_r.text.find(".cpp:"), std::string::npos) << bad_r.text;

    const testing::CliOutput negative_r = testing::run_cli(simulate + " --redundant-experts -1");
    EXPECT_NE(negative_r.exit_code, 0);
    EXPECT_CONTAINS(negative_r.text, "--redundant-experts: -1 is out of range");

    const testing::CliOutput missing =
        testing::run_cli(simulate.substr(0, simulate.find("zipf")) + "/nonexistent/run.jsonl");
    EXPECT_NE(missing.exit_code, 0);
    EXPECT_CONTAINS(missing.text, "/nonexistent/run.jsonl");

    // A training log's last histogram: tiny's 8 experts two per rank on ep4 carry 8, 2, 2 and 4
    // of a mean 4.
    testing::TempDir dir;
    const std::string log = (dir.path() / "run.jsonl").string();
    std::ofstream(log) << "{\"step\":10,\"average_expert_load\":[1,1,1,1,1,1,1,1]}\n"
                       << "{\"step\":20,\"average_expert_load\":[5,3,1,1,1,1,1,3]}\n";
    const std::string tiny =
        "simulate --config tiny --cluster h100-hgx --gpus 8 --gbs 64 --seq-len 256 ";
    const testing::CliOutput measured =
        testing::run_cli(tiny + "--layout ep4 --expert-imbalance '" + log + "'");
    ASSERT_EQ(measured.exit_code, 0) << measured.text;
    EXPECT_CONTAINS(measured.text, "tokens per EP rank max/mean 2.000 (experts split");
    const testing::CliOutput no_ep = testing::run_cli(tiny + "--layout ep1 --redundant-experts 8");
    EXPECT_NE(no_ep.exit_code, 0);
    EXPECT_CONTAINS(no_ep.text, "needs ep > 1");

    const testing::CliOutput plan = testing::run_cli(
        "plan --config tiny --cluster h100-hgx --gpus 8 --gbs 64 --seq-len 256 --top 1 "
        "--expert-imbalance zipf:1 --redundant-experts 8");
    ASSERT_EQ(plan.exit_code, 0) << plan.text;
    EXPECT_CONTAINS(plan.text, "8 redundant experts; the best layout's tokens per EP rank");
}

}  // namespace
}  // namespace moetron::sim
