// moetron train's expert load balancing flags (--redundant-experts, --rebalance-every) refuse what
// cannot run with a message a person understands, before any work. The runs themselves need
// several processes: tests/mpi/test_mpi_redundant_experts.cpp.
#include <gtest/gtest.h>

#include <string>

#include "cli_run.h"

namespace moetron::testing {
namespace {

TEST(EplbCli, RedundantExpertsWithoutExpertParallelismAreRefusedWithAReason) {
    const CliOutput redundant = run_cli("train --config tiny --redundant-experts 2 --steps 1");
    EXPECT_EQ(redundant.exit_code, 1) << redundant.text;
    EXPECT_CONTAINS(redundant.text,
                    "--redundant-experts 2 needs routed experts split over an "
                    "expert-parallel group of more than one rank");
    EXPECT_EQ(redundant.text.find(".cpp:"), std::string::npos) << "a user's mistake, no source";

    const CliOutput rebalance = run_cli("train --config tiny --rebalance-every 5 --steps 1");
    EXPECT_EQ(rebalance.exit_code, 1) << rebalance.text;
    EXPECT_CONTAINS(rebalance.text, "--rebalance-every needs expert parallelism");
    EXPECT_EQ(rebalance.text.find(".cpp:"), std::string::npos) << "a user's mistake, no source";
}

}  // namespace
}  // namespace moetron::testing
