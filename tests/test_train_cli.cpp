// The train, prepare and sample commands end to end, through the moetron binary: a text file
// becomes a token shard, a short run on it saves weights and a JSONL log, sample reads the
// weights back; bad input ends with exit code 1 and a message naming the problem.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_run.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

using Output = moetron::testing::CliOutput;
using moetron::testing::run_cli;

class TrainCli : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(fs::exists(MOETRON_BINARY))
            << MOETRON_BINARY << " is not built (build the moetron target first)";
        dir_ = fs::temp_directory_path() / ("moetron_cli_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string file(const std::string& name) const { return (dir_ / name).string(); }

    fs::path dir_;
};

TEST_F(TrainCli, PrepareTrainSampleRoundTrip) {
    {
        std::ofstream text(file("corpus.txt"));
        for (int i = 0; i < 400; ++i)
            text << "the quick brown fox jumps over the lazy dog " << i << "\n";
    }
    Output prepared =
        run_cli("prepare --text " + file("corpus.txt") + " --out " + file("corpus.tok"));
    ASSERT_EQ(prepared.exit_code, 0) << prepared.text;
    EXPECT_CONTAINS(prepared.text, "tokens (byte-level, vocab 256)");
    EXPECT_EQ(fs::file_size(file("corpus.tok")), 32 + 4 * fs::file_size(file("corpus.txt")));

    const std::string config = MOETRON_SOURCE_DIR "/configs/models/tiny.toml";
    Output trained =
        run_cli("train --config " + config + " --data " + file("corpus.tok") +
                " --steps 6 --batch-size 2 --seq-len 32 --eval-every 3 --threads 1 --log-jsonl " +
                file("log.jsonl") + " --save-final " + file("final"));
    ASSERT_EQ(trained.exit_code, 0) << trained.text;
    EXPECT_CONTAINS(trained.text, "moetron shard v1");
    EXPECT_CONTAINS(trained.text, "step 6/6");
    EXPECT_CONTAINS(trained.text, "peak RSS");
    std::ifstream log(file("log.jsonl"));
    int lines = 0;
    for (std::string line; std::getline(log, line);) ++lines;
    EXPECT_EQ(lines, 6);

    Output sampled = run_cli("sample --config " + config + " --weights " + file("final") +
                             " --prompt 'the quick' --new-tokens 20 --temperature 0 --threads 1");
    ASSERT_EQ(sampled.exit_code, 0) << sampled.text;
    EXPECT_EQ(sampled.text.rfind("the quick", 0), 0u) << sampled.text;
    EXPECT_EQ(sampled.text.size(), std::string("the quick").size() + 20 + 1);  // + newline
}

TEST_F(TrainCli, BadInputEndsWithAClearError) {
    Output missing = run_cli("train --data " + file("missing.bin") + " --steps 1");
    EXPECT_EQ(missing.exit_code, 1);
    EXPECT_CONTAINS(missing.text, file("missing.bin"));
    EXPECT_CONTAINS(missing.text, "does not exist");

    {
        // The tiny preset with a misspelt key at the end of its [train] table.
        std::ifstream tiny(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
        std::ofstream bad(file("bad.toml"));
        bad << tiny.rdbuf() << "\nlearning_rate = 1e-3\n";
    }
    Output typo = run_cli("train --config " + file("bad.toml") + " --steps 1");
    EXPECT_EQ(typo.exit_code, 1);
    EXPECT_CONTAINS(typo.text, "unknown key 'learning_rate' in [train] (did you mean");

    Output no_weights = run_cli("sample --weights " + file("none.bin") + " --new-tokens 1");
    EXPECT_EQ(no_weights.exit_code, 1);
    EXPECT_CONTAINS(no_weights.text, "does not exist");

    Output no_text = run_cli("prepare --text " + file("none.txt") + " --out " + file("x.tok"));
    EXPECT_EQ(no_text.exit_code, 1);
    EXPECT_CONTAINS(no_text.text, "does not exist");
}

// Under mpirun, in a pipe or in a log file the run prints plain lines instead of the terminal's
// bar: they carry the time left too (not on the last step's line: nothing is left).
TEST_F(TrainCli, PipedRunLogsTheTimeLeft) {
    const Output piped = run_cli(
        "train --config tiny --steps 3 --batch-size 2 --seq-len 16 "
        "--eval-every 0 --threads 1");
    ASSERT_EQ(piped.exit_code, 0) << piped.text;
    std::istringstream lines(piped.text);
    int step_lines = 0;
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("step 1/3 | loss", 0) == 0 || line.rfind("step 2/3 | loss", 0) == 0) {
            ++step_lines;
            EXPECT_CONTAINS(line, " | eta ");
        } else if (line.rfind("step 3/3 | loss", 0) == 0) {
            ++step_lines;
            EXPECT_NOT_CONTAINS(line, "eta");
        }
    }
    EXPECT_EQ(step_lines, 3) << piped.text;
    EXPECT_NOT_CONTAINS(piped.text, "\r");  // no bar in a pipe
}

// --profile-ops prints, after the run, where a step's time went: categories, the ops under them,
// and the step's total; without the flag there is no table.
TEST_F(TrainCli, ProfileOpsPrintsWhereAStepsTimeGoes) {
    const std::string config = std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml";
    const std::string run =
        "train --config " + config + " --steps 2 --batch-size 2 --seq-len 16 --threads 1";
    Output profiled = run_cli(run + " --profile-ops");
    ASSERT_EQ(profiled.exit_code, 0) << profiled.text;
    for (const char* line : {"ops     per step", "grouped GEMMs", "  grouped_linear_forward",
                             "attention", "  attention_backward", "optimizer", "  adamw_update",
                             "outside the backend's ops", "step "})
        EXPECT_CONTAINS(profiled.text, line);

    Output plain = run_cli(run);
    ASSERT_EQ(plain.exit_code, 0) << plain.text;
    EXPECT_EQ(plain.text.find("adamw_update"), std::string::npos) << plain.text;
}

// moetron info --layout plans one rank's memory by category; at DeepSeek-V3 scale the expert side
// is planned from the capacity factor (4 x the balanced 32,768 rows), not the worst case.
TEST_F(TrainCli, InfoPlansTheMemoryOfOneRank) {
    const std::string dsv3 = std::string(MOETRON_SOURCE_DIR) + "/configs/models/dsv3-671b.toml";
    const Output planned = run_cli("info --config " + dsv3 + " --layout ep64");
    ASSERT_EQ(planned.exit_code, 0) << planned.text;
    EXPECT_CONTAINS(planned.text, "planned memory per rank");
    EXPECT_CONTAINS(planned.text, "expert-side buffers");
    EXPECT_CONTAINS(
        planned.text,
        "expert-side rows per MoE layer: 131072 (capacity factor 4; worst case 1048576)");
    const Output worst =
        run_cli("info --config " + dsv3 + " --layout ep64 --moe-capacity-factor 0");
    ASSERT_EQ(worst.exit_code, 0) << worst.text;
    EXPECT_CONTAINS(worst.text, "expert-side rows per MoE layer: 1048576 (capacity factor 0");
    const Output bad = run_cli("info --config " + dsv3 + " --layout ep3");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_CONTAINS(bad.text, "ep 3 does not divide the 256 routed experts");
}

}  // namespace
}  // namespace moetron
