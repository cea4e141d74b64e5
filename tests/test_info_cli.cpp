// moetron info's per-rank plan is a run's plan (train/run_plan.h): the same settings as train
// (redundant experts and the recipe's token format among them), and none for a run that could not
// train.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"

namespace moetron {
namespace {

using testing::CliOutput;
using testing::run_cli;

nlohmann::json info_json(const std::string& args) {
    const CliOutput out = run_cli("info --json " + args);
    EXPECT_EQ(out.exit_code, 0) << out.text;
    return nlohmann::json::parse(out.text);
}

TEST(InfoCli, PlansTheSpareExpertSlotsAndTheRecipesTokens) {
    const auto plain = info_json("--config tiny --seq-len 128 --layout ep2");
    const auto spare = info_json("--config tiny --seq-len 128 --layout ep2 --redundant-experts 2");
    EXPECT_GT(spare["memory_per_rank_bytes"]["parameters"].get<double>(),
              plain["memory_per_rank_bytes"]["parameters"].get<double>());
    // MXFP8 tokens need their packed and decoded buffers beside the float32 rows.
    const auto mxfp8 = info_json("--config tiny --seq-len 128 --layout ep2 --precision mxfp8");
    EXPECT_NE(mxfp8["memory_per_rank_bytes"]["communication_buffers"].get<double>(),
              plain["memory_per_rank_bytes"]["communication_buffers"].get<double>());
}

TEST(InfoCli, SaysWhyThereIsNoPlanForSequencesLongerThanThePositions) {
    const CliOutput out = run_cli("info --config tiny --seq-len 4096");
    EXPECT_EQ(out.exit_code, 0) << out.text;
    EXPECT_NE(out.text.find("none at seq 4096, longer than the model's 256 positions"),
              std::string::npos)
        << out.text;
    EXPECT_TRUE(info_json("--config tiny --seq-len 4096")["memory_per_rank_bytes"].is_null());
}

}  // namespace
}  // namespace moetron
