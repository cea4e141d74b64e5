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

#include <regex>
#include <vector>

#include "moetron/cli/plan_progress.h"
#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/sim/planner.h"

namespace moetron::sim {
namespace {

using cli::PlanProgressPrinter;

const std::string kRoot = MOETRON_SOURCE_DIR;

TEST(SimPlanner, RanksFittingLayoutsAndRejectsTheRest) {
    const ModelConfig m = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    const ClusterSpec c = load_cluster_spec(kRoot + "/configs/clusters/h100-hgx.toml");
    SimOptions base;
    base.precision = Precision::fp8_blockwise;
    base.seq_len = 4096;
    base.global_batch = 1024;
    base.moe_overlap = MoeOverlap::dual;
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

// A progress callback sees every layout counted once, against a total known from the start, and
// the best so far; the search's result is the same with it as without.
TEST(SimPlanner, ProgressCountsEveryLayoutAndLeavesTheResultAlone) {
    const ModelConfig m = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    const ClusterSpec c = load_cluster_spec(kRoot + "/configs/clusters/h100-hgx.toml");
    SimOptions base;
    base.precision = Precision::fp8_blockwise;
    base.seq_len = 4096;
    base.global_batch = 1024;
    PlanSpace space;
    space.tp = {1, 2};
    space.pp = {4, 8, 16};
    space.vpp = {1, 2};
    space.ep = {8, 32, 64};
    space.micro_batch = {1, 2};
    space.recompute = {"none", "mla_up_proj,mlp", "full"};
    const PlanResult quiet = plan_layouts(m, c, 256, base, space);

    std::vector<PlanProgress> seen;
    std::vector<double> best_tflops;
    const PlanResult watched = plan_layouts(m, c, 256, base, space, [&](const PlanProgress& p) {
        seen.push_back(p);
        best_tflops.push_back(p.best != nullptr ? p.best->result.tflops_per_gpu : 0.0);
    });

    ASSERT_EQ(watched.considered, quiet.considered);
    EXPECT_EQ(watched.rejected_memory, quiet.rejected_memory);
    ASSERT_EQ(watched.ranked.size(), quiet.ranked.size());
    for (size_t i = 0; i < quiet.ranked.size(); ++i) {
        EXPECT_EQ(watched.ranked[i].result.layout.str(), quiet.ranked[i].result.layout.str());
        EXPECT_EQ(watched.ranked[i].result.options.micro_batch,
                  quiet.ranked[i].result.options.micro_batch);
        EXPECT_EQ(watched.ranked[i].recompute, quiet.ranked[i].recompute);
        EXPECT_EQ(watched.ranked[i].result.tflops_per_gpu, quiet.ranked[i].result.tflops_per_gpu);
    }

    ASSERT_FALSE(seen.empty());
    EXPECT_GT(quiet.rejected_memory, 0);  // both kinds of evaluation are counted
    for (size_t i = 0; i < seen.size(); ++i) {
        EXPECT_EQ(seen[i].total, quiet.considered) << "the total is known from the first call";
        if (i > 0) {
            EXPECT_GT(seen[i].evaluated, seen[i - 1].evaluated);
            EXPECT_GE(best_tflops[i], best_tflops[i - 1]) << "the best so far never falls";
        }
    }
    EXPECT_EQ(seen.back().evaluated, quiet.considered);
    EXPECT_EQ(best_tflops.back(), quiet.ranked.front().result.tflops_per_gpu);
}

std::string read_all(std::FILE* f) {
    std::rewind(f);
    std::string text;
    std::array<char, 4096> buffer{};
    size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), f)) > 0) text.append(buffer.data(), n);
    return text;
}

// Off a terminal: a line every line_every_s of the search's clock, and the count at the end.
TEST(PlanProgressPrinter, PrintsALineEverySoOftenOffATerminal) {
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    PlanCandidate best;
    best.result.layout.tp = 2;
    best.result.layout.ep = 8;
    best.result.options.micro_batch = 1;
    best.result.tflops_per_gpu = 612.34;
    PlanProgressPrinter printer(out, /*terminal_columns=*/0, /*line_every_s=*/5);
    printer.update({10, 400, nullptr}, 1.0);
    printer.update({100, 400, &best}, 5.5);  // a line
    printer.update({150, 400, &best}, 7.0);
    printer.update({399, 400, &best}, 10.6);  // a line
    printer.update({400, 400, &best}, 10.9);
    printer.finish(11.25);
    const std::string text = read_all(out);
    std::fclose(out);
    EXPECT_EQ(text, "plan: 100/400 layouts (25%) in 6 s; best 612.3 TFLOPs/GPU: " +
                        best.result.layout.str() +
                        " mbs1\n"
                        "plan: 399/400 layouts (100%) in 11 s; best 612.3 TFLOPs/GPU: " +
                        best.result.layout.str() +
                        " mbs1\n"
                        "plan: evaluated 400 layouts in 11.2 s\n");
}

// On a terminal: one line redrawn in place, narrower than the terminal (a line that wraps leaves
// rows behind), replaced by the count.
TEST(PlanProgressPrinter, RedrawsOneLineOnATerminal) {
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    PlanCandidate best;
    best.result.layout.tp = 8;
    best.result.layout.cp = 2;
    best.result.layout.pp = 16;
    best.result.layout.vpp = 8;
    best.result.layout.ep = 256;
    best.result.layout.dp = 1024;
    best.result.options.micro_batch = 2;
    best.result.tflops_per_gpu = 1234.5;
    PlanProgressPrinter printer(out, /*terminal_columns=*/70);
    for (int i = 1; i <= 10; ++i) printer.update({i * 1000, 10000, &best}, 0.15 * i);
    printer.finish(1.6);
    const std::string text = read_all(out);
    std::fclose(out);
    EXPECT_EQ(text.find('\n'), text.size() - 1) << "one line, ended at the finish: " << text;
    EXPECT_NE(
        text.find("\r\x1b[Kplan: 10000/10000 layouts (100%) in 2 s; best 1234.5 TFLOPs/GPU: tp8"),
        std::string::npos)
        << text;
    size_t begin = 0;
    while ((begin = text.find("\r\x1b[K", begin)) != std::string::npos) {
        begin += 4;
        const size_t end = std::min(text.find('\r', begin), text.size());
        EXPECT_LT(end - begin, 70u) << text.substr(begin, end - begin);
    }
    EXPECT_NE(text.find("\r\x1b[Kplan: evaluated 10000 layouts in 1.6 s\n"), std::string::npos);
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

// moetron plan's progress goes to stderr, so that stdout holds the plan alone (for a pipe or a
// file), and off a terminal it ends with the count of layouts the plan's stdout reports.
TEST(SimCommands, PlanProgressGoesToStderrOnly) {
    const std::string err_path = ::testing::TempDir() + "moetron_plan_progress.err";
    const std::string cmd = std::string(MOETRON_BINARY) +
                            " plan --config tiny --cluster h100-hgx --gpus 8 --gbs 64 "
                            "--seq-len 256 2>" +
                            err_path;
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    ASSERT_NE(pipe, nullptr);
    const std::string out = read_all(pipe.get());
    EXPECT_EQ(WEXITSTATUS(pclose(pipe.release())), 0) << out;
    std::unique_ptr<FILE, int (*)(FILE*)> err_file(std::fopen(err_path.c_str(), "r"), fclose);
    ASSERT_NE(err_file, nullptr);
    const std::string err = read_all(err_file.get());
    std::remove(err_path.c_str());

    EXPECT_EQ(out.rfind("moetron plan: ", 0), 0u) << out;
    EXPECT_EQ(out.find("\nplan: "), std::string::npos) << "no progress line on stdout: " << out;
    std::smatch counted;
    ASSERT_TRUE(std::regex_search(out, counted, std::regex("  ([0-9]+) layouts divide"))) << out;
    EXPECT_NE(err.find("plan: evaluated " + counted[1].str() + " layouts in "), std::string::npos)
        << err;
    EXPECT_EQ(err.find('\r'), std::string::npos) << "no redrawn line off a terminal: " << err;
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
    EXPECT_NE(out.find("--precision mxfp8 runs its GEMMs at the mxfp8 rate, which H100"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find(".cpp:"), std::string::npos) << out;

    std::tie(rc, out) = run("simulate" + model + h100 +
                            " --gpus 64 --layout tp1.pp2.ep32 --gbs 64 --precision fp8-blockwise");
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("GB over"), std::string::npos) << out;

    std::tie(rc, out) = run("plan --config " + kRoot + "/configs/models/tiny.toml" + h100 +
                            " --gpus 8 --gbs 64 --seq-len 256 --scaling 8,16");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("#5 "), std::string::npos) << out;
    EXPECT_NE(out.find("16 GPUs"), std::string::npos) << out;

    // The memory options and schedules reach the simulation; the table has one row per stage.
    std::tie(rc, out) =
        run("simulate" + model + h100 +
            " --gpus 1024 --layout tp2.pp8.ep64 --gbs 8192 --precision fp8-blockwise"
            " --recompute mla_up_proj,mlp --pp-schedule zb-h1"
            " --exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 --main-grads-dtype bf16"
            " --offload-activations moe");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("zb-h1 recompute mla_up_proj,mlp"), std::string::npos) << out;
    EXPECT_NE(out.find("main grads 2, main params 4, exp_avg 4, exp_avg_sq 4 bytes"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("\n        7 "), std::string::npos) << out;  // stage 7's row
    std::tie(rc, out) =
        run("simulate" + model + h100 +
            " --gpus 1024 --layout tp2.pp8.ep64 --gbs 8192 --precision fp8-blockwise"
            " --exp-avg-dtype int4");
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("--exp-avg-dtype must be fp32, bf16, fp16 or fp8, got 'int4'"),
              std::string::npos)
        << out;
}

}  // namespace
}  // namespace moetron::sim
