// sim/planner and the two commands: the search keeps only layouts that fit, ranks them by
// TFLOPs/GPU, explains them; `moetron simulate` and `moetron plan` run end to end and fail with
// a clear message and exit code 1 on impossible input.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>

#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/sim/planner.h"

namespace moetron::sim {
namespace {

const std::string kRoot = MOETRON_SOURCE_DIR;

TEST(SimPlanner, RanksFittingLayoutsAndRejectsTheRest) {
    const ModelConfig m = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    const ClusterSpec c = load_cluster_spec(kRoot + "/configs/clusters/h100-hgx.toml");
    SimOptions base;
    base.precision = Precision::fp8;
    base.seq_len = 4096;
    base.global_batch = 1024;
    base.overlap_ep = true;
    PlanSpace space;
    space.tp = {1, 2};
    space.pp = {4, 8, 16};
    space.vpp = {1, 2};
    space.ep = {8, 32, 64};
    space.micro_batch = {1};
    space.recompute = {"none", "mla_up_proj,mlp", "full"};
    const PlanResult plan = plan_layouts(m, c, 256, base, space);
    ASSERT_GE(plan.ranked.size(), 2u);
    EXPECT_GT(plan.rejected_memory, 0);  // 671B does not fit everywhere on 80 GB
    EXPECT_EQ(plan.considered - plan.rejected_memory, static_cast<int64_t>(plan.ranked.size()));
    for (size_t i = 0; i < plan.ranked.size(); ++i) {
        const StepResult& r = plan.ranked[i].result;
        EXPECT_LE(r.memory.total_bytes(), r.memory.capacity_bytes);
        if (i > 0) {
            EXPECT_LE(r.tflops_per_gpu, plan.ranked[i - 1].result.tflops_per_gpu);
        }
    }
    const std::string first = explain_candidate(plan.ranked[0], plan.ranked[0], 1);
    const std::string second = explain_candidate(plan.ranked[1], plan.ranked[0], 2);
    EXPECT_EQ(first.rfind("#1 ", 0), 0u);
    EXPECT_NE(second.find("behind #1"), std::string::npos) << second;
}

// A layout that splits the heads but not the vocabulary (or an FFN) cannot be built by the engine's
// tensor parallelism, whose parameter count the cluster model uses: the planner leaves it out
// instead of failing the whole search, and simulating it names the number that does not split.
TEST(SimPlanner, SkipsLayoutsWhoseTensorParallelSplitDoesNotFit) {
    ModelConfig m = load_model_config(kRoot + "/configs/models/tiny.toml");
    m.vocab_size = 258;  // splits over tp 2, not over tp 4; tiny's 4 heads split over both
    const ClusterSpec c = load_cluster_spec(kRoot + "/configs/clusters/h100-hgx.toml");
    SimOptions base;
    base.seq_len = 64;
    base.global_batch = 16;
    PlanSpace space;
    space.tp = {1, 2, 4};
    space.pp = {1};
    space.vpp = {1};
    space.ep = {1};
    space.micro_batch = {1};
    space.recompute = {"none"};
    const PlanResult plan = plan_layouts(m, c, 4, base, space);
    ASSERT_FALSE(plan.ranked.empty());
    for (const PlanCandidate& p : plan.ranked)
        EXPECT_NE(p.result.layout.tp, 4) << p.result.layout.str();

    parallel::Layout tp4;
    tp4.tp = 4;
    tp4.dp = 1;
    try {
        simulate_step(m, c, tp4, base);
        ADD_FAILURE() << "tp4 of a 258-token vocabulary was simulated";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find("tp 4 does not divide vocab_size 258"),
                  std::string::npos)
            << e.what();
    }
}

// Runs the moetron binary; returns its exit code and combined output.
std::pair<int, std::string> run(const std::string& args) {
    const std::string cmd = std::string(MOETRON_BINARY) + " " + args + " 2>&1";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    std::string out;
    std::array<char, 4096> buf{};
    while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
    const int status = pclose(pipe.release());
    return {WEXITSTATUS(status), out};
}

TEST(SimCommands, SimulateAndPlanEndToEnd) {
    const std::string model = " --config " + kRoot + "/configs/models/dsv3-671b.toml";
    const std::string gb300 = " --cluster " + kRoot + "/configs/clusters/gb300-nvl72.toml";
    const std::string h100 = " --cluster " + kRoot + "/configs/clusters/h100-hgx.toml";
    auto [rc, out] = run("simulate" + model + gb300 +
                         " --gpus 256 --layout tp1.pp2.vpp4.ep32 --gbs 4096 --mbs 1 --seq-len 4096"
                         " --precision mxfp8 --no-count-mtp --json");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"tflops_per_gpu\""), std::string::npos) << out;

    std::tie(rc, out) = run("simulate" + model + h100 +
                            " --gpus 1024 --layout tp2.pp8.vpp4.ep64 --gbs 8192 --precision mxfp8");
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("no mxfp8"), std::string::npos) << out;

    std::tie(rc, out) = run("simulate" + model + h100 +
                            " --gpus 64 --layout tp1.pp2.ep32 --gbs 64 --precision fp8");
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("GB over"), std::string::npos) << out;

    std::tie(rc, out) = run("plan --config " + kRoot + "/configs/models/tiny.toml" + h100 +
                            " --gpus 8 --gbs 64 --seq-len 256 --scaling 8,16");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("#5 "), std::string::npos) << out;
    EXPECT_NE(out.find("16 GPUs"), std::string::npos) << out;

    // The memory options and schedules reach the simulation; the table has one row per stage.
    std::tie(rc, out) = run("simulate" + model + h100 +
                            " --gpus 1024 --layout tp2.pp8.ep64 --gbs 8192 --precision fp8"
                            " --recompute mla_up_proj,mlp --pp-schedule zb-h1"
                            " --exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 --main-grads-dtype bf16"
                            " --offload-activations moe");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("zb-h1 recompute mla_up_proj,mlp"), std::string::npos) << out;
    EXPECT_NE(out.find("main grads 2, main params 4, exp_avg 4, exp_avg_sq 4 bytes"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("\n        7 "), std::string::npos) << out;  // stage 7's row
    std::tie(rc, out) = run("simulate" + model + h100 +
                            " --gpus 1024 --layout tp2.pp8.ep64 --gbs 8192 --precision fp8"
                            " --exp-avg-dtype int4");
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("--exp-avg-dtype must be fp32, bf16, fp16 or fp8, got 'int4'"),
              std::string::npos)
        << out;
}

}  // namespace
}  // namespace moetron::sim
